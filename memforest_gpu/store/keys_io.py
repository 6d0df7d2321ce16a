"""A store's keys (:mod:`.keys`) in its files: the ``keys`` and ``key_sources`` columns and the
rule, read back into :class:`~.keys.NodeKeys` with every problem named by path and node."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from .keys import NodeKeys, keys_rule_from_json

__all__ = ["keys_arrow", "keys_records", "keys_from_columns", "PARQUET_KEYS_KEY", "KEY_COLUMNS"]

PARQUET_KEYS_KEY = b"memforest.keys"  # the rule, JSON, in the Parquet schema metadata
KEY_COLUMNS = ("keys", "key_sources")


def keys_arrow(keys: NodeKeys, dim: int) -> tuple[pa.Array, pa.Array]:
    """The two columns (per node: a list of vectors, a list of id lists; null for no key).

    Shape: keys of N nodes -> (N,), (N,)
    """
    counts = keys.counts
    offs = pa.array(keys.offsets.astype(np.int32), type=pa.int32())
    mask = pa.array(counts == 0)
    vec = np.ascontiguousarray(keys.vectors.detach().to("cpu", torch.float32).numpy())
    inner = pa.FixedSizeListArray.from_arrays(pa.array(vec.reshape(-1), type=pa.float32()), dim)
    kcol = pa.ListArray.from_arrays(offs, inner, mask=mask)
    scol = pa.ListArray.from_arrays(offs, keys.sources.cast(pa.list_(pa.string())), mask=mask)
    return kcol, scol


def keys_records(keys: NodeKeys, lo: int, hi: int) -> list[tuple[list | None, list | None]]:
    """Per node of rows ``lo:hi``: (its key vectors as lists, their sources), or (None, None)."""
    o = keys.offsets
    vec = keys.vectors[int(o[lo]):int(o[hi])].detach().to("cpu", torch.float32).numpy()
    src = keys.sources.slice(int(o[lo]), int(o[hi] - o[lo])).to_pylist()
    out = []
    for i in range(lo, hi):
        a, b = int(o[i] - o[lo]), int(o[i + 1] - o[lo])
        out.append((vec[a:b].tolist(), src[a:b]) if b > a else (None, None))
    return out


def _node_lists(col, n: int, what: str, path: str) -> tuple[np.ndarray, list | pa.Array]:
    """(counts (n,), the flat items) of a per-node list column (Arrow or Python, None: empty)."""
    if isinstance(col, (pa.Array, pa.ChunkedArray)):
        col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        counts = pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False).astype(np.int64)
        return counts, col.flatten()
    counts, flat = np.zeros(n, dtype=np.int64), []
    for j, v in enumerate(col):
        if v is None:
            continue
        if not isinstance(v, list):
            raise ValueError(f"{path}: {what} of node {j} must be a list, got {type(v).__name__}")
        counts[j] = len(v)
        flat += v
    return counts, flat


def keys_from_columns(cols: dict, store, path: str) -> NodeKeys | None:
    """The keys a file holds (``cols``: ``keys``, ``key_sources``, ``keys_rule`` as the readers
    give them) for ``store`` (its ids, sources, dimension and device), or ``None`` when it holds
    none. Raises ``ValueError`` naming the path for keys without a rule, a count or dimension
    that does not match, a non-finite or zero vector, or a key source its node does not hold."""
    kcol, scol, rule = cols.get("keys"), cols.get("key_sources"), cols.get("keys_rule")
    if kcol is None and scol is None:
        return None
    if rule is None or kcol is None or scol is None:
        raise ValueError(f"{path}: keys must come with key_sources and their rule ({PARQUET_KEYS_KEY.decode()}), "
                         f"got keys {'present' if kcol is not None else 'missing'}, key_sources "
                         f"{'present' if scol is not None else 'missing'}, rule {'present' if rule else 'missing'}")
    rule = keys_rule_from_json(rule if isinstance(rule, str) else rule.decode("utf-8"), path)
    n, dim = len(store), store.dim
    counts, flat = _node_lists(kcol, n, "keys", path)
    s_counts, s_flat = _node_lists(scol, n, "key_sources", path)
    bad = np.flatnonzero(counts != s_counts)
    if bad.size:
        j = int(bad[0])
        raise ValueError(f"{path}: key_sources of node {store.ids[j]!r} must have one list per key ({counts[j]}), "
                         f"got {s_counts[j]}")
    vec = _vectors(flat, int(counts.sum()), dim, path)
    src = s_flat if isinstance(s_flat, pa.Array) else pa.array(s_flat, type=pa.large_list(pa.large_string()))
    keys = NodeKeys.from_lists(counts, vec.to(store.device), src, **rule)
    keys.check(store.sources.arrow, store.ids.arrow)
    return keys


def _vectors(flat, m: int, dim: int, path: str) -> torch.Tensor:
    """The key vectors, (m, dim) float32 unit rows."""
    if isinstance(flat, pa.Array):
        lengths = pc.list_value_length(flat).to_numpy(zero_copy_only=False) if m else np.zeros(0)
        values = flat.flatten().to_numpy(zero_copy_only=False) if m else np.zeros(0)
    else:
        lengths = np.array([len(v) if isinstance(v, list) else -1 for v in flat], dtype=np.int64)
        values = np.array([x for v in flat if isinstance(v, list) for x in v], dtype=np.float64) \
            if (lengths == dim).all() else None
    if m and not (lengths == dim).all():
        raise ValueError(f"{path}: keys must have the store's dimension ({dim}), got a key of "
                         f"{int(lengths[lengths != dim][0])}")
    v = torch.from_numpy(np.array(values, dtype=np.float32).reshape(m, dim))
    norms = v.double().norm(dim=1)
    if m and (not bool(torch.isfinite(v).all()) or bool((norms <= 1e-12).any())):
        raise ValueError(f"{path}: keys must be finite non-zero vectors, got a NaN, inf or zero key")
    if not m or bool(((norms - 1.0).abs() <= 1e-6).all()):
        return v  # unit rows already: a write / read round trip keeps them bit for bit
    return (v.double() / norms[:, None]).float()
