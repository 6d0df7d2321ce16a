"""A store's key vectors: what a merged node is searched by besides its text's vector.

A merged node's text is the embedding of several memories, and a question about one of them
matches it less than it matched that memory alone. So a merged node may keep **keys**: up to
``max_keys`` vectors of its sources (their own vectors, or ``max_keys`` centres of them when it
has more; ``None``: every source), each with the original ids it stands for. A node with keys
is scored

    score = text_weight * cos(q, text vector) + (1 - text_weight) * max_k cos(q, key_k)

and a node without keys (an original, or any node of a store without keys) by its text's
cosine alone, as before. ``text_weight`` is one number per store, kept with the keys.

Layout (CSR): ``vectors`` (M, D) unit rows, node ``i``'s keys are rows
``offsets[i]:offsets[i + 1]``; ``sources`` (M,) list<large_string>, the original ids of each
key (a subset of its node's ``sources``; a node's keys together hold each of its sources once).

In files (:mod:`.parquet`, :mod:`.jsonl`): per node ``keys`` (a list of vectors, null / absent
for none) and ``key_sources`` (a list of id lists), and the rule as JSON (Parquet schema
metadata ``memforest.keys``, the JSON Lines header's ``"keys"``):
``{"text_weight": 0.5, "max_keys": 3}``. A store without them reads and searches as before.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

__all__ = ["NodeKeys", "ranges", "keys_rule_json", "keys_rule_from_json", "check_max_keys", "check_text_weight"]


def check_max_keys(value) -> None:
    """``max_keys`` must be an integer >= 1 or None (every source)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"max_keys must be an integer >= 1 or None (every source), got {value!r}")


def check_text_weight(value) -> None:
    """``text_weight`` must be a number in [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"text_weight must be a number in [0, 1], got {value!r}")


@dataclass
class NodeKeys:
    """Key vectors per node (see the module doc).

    Shape: vectors (M, D) float32 unit rows, or int8 codes (:mod:`.codes`: a quarter of the
    memory; :meth:`unit` decodes them), offsets (N + 1,) int64 host, sources (M,)
    list<large_string>
    """

    vectors: torch.Tensor
    offsets: np.ndarray
    sources: pa.Array
    text_weight: float
    max_keys: int | None

    def __post_init__(self):
        check_text_weight(self.text_weight)
        check_max_keys(self.max_keys)
        self.offsets = np.asarray(self.offsets, dtype=np.int64)
        M = int(self.vectors.shape[0])
        o = self.offsets
        if o.ndim != 1 or len(o) < 1 or o[0] != 0 or o[-1] != M or bool((np.diff(o) < 0).any()):
            raise ValueError(f"key offsets must rise from 0 to the number of keys ({M}), got {o[:8].tolist()}...")
        if len(self.sources) != M:
            raise ValueError(f"key sources must have one list per key ({M}), got {len(self.sources)}")
        if isinstance(self.sources, pa.ChunkedArray):
            self.sources = self.sources.combine_chunks()
        if self.sources.type != pa.large_list(pa.large_string()):
            self.sources = self.sources.cast(pa.large_list(pa.large_string()))

    @classmethod
    def empty(cls, n: int, dim: int, *, text_weight: float, max_keys: int | None, device=None) -> NodeKeys:
        """No node has keys (every node is searched by its text's vector)."""
        return cls(torch.empty(0, dim, dtype=torch.float32, device=device), np.zeros(n + 1, dtype=np.int64),
                   pa.array([], type=pa.large_list(pa.large_string())), text_weight, max_keys)

    @classmethod
    def from_lists(cls, counts, vectors, sources, *, text_weight: float, max_keys: int | None) -> NodeKeys:
        """From per-node key counts, the (M, D) vectors in node order and M id lists."""
        counts = np.asarray(counts, dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        if not isinstance(sources, (pa.Array, pa.ChunkedArray)):
            sources = pa.array([list(s) for s in sources], type=pa.large_list(pa.large_string()))
        v = torch.as_tensor(vectors)
        return cls(v if v.dtype == torch.int8 else v.float(), offsets, sources, text_weight, max_keys)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def unit(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The key vectors (of ``rows``) as float32 unit rows: int8 codes decoded and normalised.

        Shape: rows (m,) -> (m, D) float32
        """
        v = self.vectors if rows is None else self.vectors[rows]
        return torch.nn.functional.normalize(v.float(), dim=1) if v.dtype == torch.int8 else v.float()

    @property
    def counts(self) -> np.ndarray:
        """Keys per node. Shape: (N,) int64"""
        return np.diff(self.offsets)

    @property
    def owner(self) -> np.ndarray:
        """The node of each key. Shape: (M,) int64"""
        return np.repeat(np.arange(len(self), dtype=np.int64), self.counts)

    @property
    def rule(self) -> dict:
        return {"text_weight": float(self.text_weight), "max_keys": self.max_keys}

    def take(self, index: np.ndarray) -> NodeKeys:
        """The keys of nodes ``index`` (in that order). Shape: (n,) -> keys of n nodes"""
        idx = np.asarray(index, dtype=np.int64)
        counts = self.counts[idx]
        rows = ranges(self.offsets[idx], counts)
        t = torch.as_tensor(rows, dtype=torch.int64, device=self.vectors.device)
        return NodeKeys.from_lists(counts, self.vectors[t], self.sources.take(pa.array(rows, type=pa.int64())),
                                   text_weight=self.text_weight, max_keys=self.max_keys)

    def to(self, device) -> NodeKeys:
        return NodeKeys(self.vectors.to(device), self.offsets, self.sources, self.text_weight, self.max_keys)

    def check(self, node_sources: pa.Array, ids: pa.Array) -> None:
        """A node with keys holds each of its sources exactly once over its keys: every key
        source is among its node's sources, none twice, none left out (names the first node that
        breaks it)."""
        if not len(self.sources):
            return
        empty = np.flatnonzero(pc.fill_null(pc.list_value_length(self.sources), 0).to_numpy(zero_copy_only=False) == 0)
        if empty.size:
            raise ValueError(f"each key of node {ids[int(self.owner[empty[0]])].as_py()!r} must stand for at least one "
                             f"of its sources, got a key with none")
        kflat = pc.cast(self.sources.flatten(), pa.large_string())
        kowner = self.owner[pc.list_parent_indices(self.sources).to_numpy(zero_copy_only=False)]
        nflat = pc.cast(node_sources.flatten(), pa.large_string())
        nowner = pc.list_parent_indices(node_sources).to_numpy(zero_copy_only=False)
        want = _pairs(kowner, kflat)
        have = _pairs(nowner, nflat)
        bad = ~pc.is_in(want, value_set=have).to_numpy(zero_copy_only=False)
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            raise ValueError(f"key sources of node {ids[int(kowner[j])].as_py()!r} must be among its sources, "
                             f"got {kflat[j].as_py()!r}")
        if len(pc.unique(want)) != len(want):
            vc = pc.value_counts(want)
            dup = pc.filter(vc.field("values"), pc.greater(vc.field("counts"), 1))[0].as_py()
            node, src = dup.split("\x1f", 1)
            raise ValueError(f"key sources of node {ids[int(node)].as_py()!r} must name each of its sources once, "
                             f"got {src!r} twice")
        n = len(self)
        per_key = np.bincount(kowner, minlength=n)  # (N,) source ids over a node's keys
        per_node = np.bincount(nowner, minlength=n)[:n]
        short = np.flatnonzero((self.counts > 0) & (per_key != per_node))
        if short.size:
            j = int(short[0])
            raise ValueError(f"keys of node {ids[j].as_py()!r} must hold each of its {int(per_node[j])} sources, "
                             f"got {int(per_key[j])}")

    @staticmethod
    def concat(parts: list[NodeKeys | None], sizes: list[int], dim: int, device) -> NodeKeys | None:
        """The keys of stores laid end to end (a part without keys: its nodes have none), or
        ``None`` when no part has keys. The rule is the first keyed part's."""
        ruled = [k for k in parts if k is not None]
        if not ruled:
            return None
        ks = [k if k is not None else NodeKeys.empty(n, dim, text_weight=ruled[0].text_weight,
                                                      max_keys=ruled[0].max_keys, device=device)
              for k, n in zip(parts, sizes)]
        int8 = all(k.vectors.dtype == torch.int8 for k in ks if len(k.vectors))
        return NodeKeys.from_lists(np.concatenate([k.counts for k in ks]),
                                   torch.cat([(k.vectors.to(torch.int8) if int8 else k.unit()).to(device) for k in ks]),
                                   pa.concat_arrays([k.sources for k in ks]), text_weight=ruled[0].text_weight,
                                   max_keys=ruled[0].max_keys)

    def nbytes(self) -> int:
        """Bytes of the key vectors (float32, or int8 codes)."""
        return int(self.vectors.shape[0]) * int(self.vectors.shape[1]) * self.vectors.element_size()


def _pairs(owner: np.ndarray, ids: pa.Array) -> pa.Array:
    """``"{owner}\\x1f{id}"`` strings, one per (node, source) pair."""
    own = pa.array(owner.astype(str), type=pa.large_string())
    return pc.binary_join_element_wise(own, ids, pa.scalar("\x1f", pa.large_string()))


def ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``concat(arange(s, s + c))`` without a Python loop. Shape: (n,), (n,) -> (sum(counts),)"""
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(counts)
    base = np.repeat(starts - (ends - counts), counts)
    return base + np.arange(total, dtype=np.int64)


def keys_rule_json(keys: NodeKeys) -> str:
    return json.dumps(keys.rule)


def keys_rule_from_json(text, path: str) -> dict:
    """``{"text_weight": w, "max_keys": k}`` read back, checked."""
    try:
        rule = json.loads(text)
    except (TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: the keys rule must be JSON, got {text!r}: {e}") from None
    if not isinstance(rule, dict) or "text_weight" not in rule:
        raise ValueError(f"{path}: the keys rule must be an object with text_weight, got {rule!r}")
    try:
        check_text_weight(rule["text_weight"])
        check_max_keys(rule.get("max_keys"))
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return {"text_weight": float(rule["text_weight"]), "max_keys": rule.get("max_keys")}
