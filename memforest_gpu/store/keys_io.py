"""A store's keys (:mod:`.keys`) in its files: the ``keys`` and ``key_sources`` columns and the
rule, read back into :class:`~.keys.NodeKeys` with every problem named by path and node."""
from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from .codes import int8_codes
from .keys import NodeKeys, keys_rule_from_json, keys_rule_json

log = logging.getLogger(__name__)

__all__ = ["keys_arrow", "keys_records", "keys_from_columns", "keys_rule_of", "DEFAULT_RULE", "PARQUET_KEYS_KEY",
           "KEY_COLUMNS"]

PARQUET_KEYS_KEY = b"memforest.keys"  # the rule, JSON, in the Parquet schema metadata
KEY_COLUMNS = ("keys", "key_sources", "keys_rule")
# the rule a store's keys follow when its file no longer says (a tool that rewrote the file without its
# metadata and without the keys_rule column): the memforest preset's
DEFAULT_RULE = {"text_weight": 0.5, "max_keys": None}


def keys_arrow(keys: NodeKeys, dim: int, codes: str = "float32", *, rows: tuple[int, int] | None = None
               ) -> tuple[pa.Array, pa.Array, pa.Array]:
    """The three columns (per node: a list of vectors, a list of id lists, the rule as JSON; null
    for a node without keys). ``codes``: the vectors as float32 or int8 codes (:mod:`.codes`).
    ``rows``: only nodes ``lo:hi`` (a row group of a file written a piece at a time).

    Shape: keys of N nodes -> (N,), (N,), (N,) (rows: (hi - lo,) each)
    """
    lo, hi = (0, len(keys)) if rows is None else rows
    o = keys.offsets[lo:hi + 1]
    k0, k1 = int(o[0]), int(o[-1])
    counts = np.diff(o)
    offs = pa.array((o - k0).astype(np.int32), type=pa.int32())
    mask = pa.array(counts == 0)
    v = keys.vectors[k0:k1]
    if codes == "int8":  # codes made once (the engine's int8 keys) are written as they are
        flat = pa.array((v.cpu().numpy() if v.dtype == torch.int8 else int8_codes(v)).reshape(-1), type=pa.int8())
    else:
        u = keys.unit() if rows is None else keys.unit(torch.arange(k0, k1, device=v.device))
        flat = pa.array(np.ascontiguousarray(u.detach().cpu().numpy()).reshape(-1), type=pa.float32())
    inner = pa.FixedSizeListArray.from_arrays(flat, dim)
    kcol = pa.ListArray.from_arrays(offs, inner, mask=mask)
    scol = pa.ListArray.from_arrays(offs, keys.sources.slice(k0, k1 - k0).cast(pa.list_(pa.string())), mask=mask)
    rule = keys_rule_json(keys)
    rcol = pa.DictionaryArray.from_arrays(pa.array(np.where(counts > 0, 0, -1).astype(np.int32), mask=counts == 0),
                                          pa.array([rule], type=pa.string())).cast(pa.string())
    return kcol, scol, rcol


def keys_records(keys: NodeKeys, lo: int, hi: int, codes: str = "float32") -> list[tuple[list | None, list | None]]:
    """Per node of rows ``lo:hi``: (its key vectors as lists, float or int8 codes, their
    sources), or (None, None)."""
    o = keys.offsets
    v = keys.vectors[int(o[lo]):int(o[hi])]
    if codes == "int8":
        vec = v.cpu().numpy() if v.dtype == torch.int8 else int8_codes(v)
    else:
        vec = keys.unit(torch.arange(int(o[lo]), int(o[hi]), device=v.device)).cpu().numpy()
    src = keys.sources.slice(int(o[lo]), int(o[hi] - o[lo])).to_pylist()
    out = []
    for i in range(lo, hi):
        a, b = int(o[i] - o[lo]), int(o[i + 1] - o[lo])
        out.append((vec[a:b].tolist(), src[a:b]) if b > a else (None, None))
    return out


def _node_lists(col, n: int, what: str, path: str, ids) -> tuple[np.ndarray, list | pa.Array]:
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
            raise ValueError(f"{path}: {what} of node {ids[j]!r} must be a list, got {type(v).__name__}")
        counts[j] = len(v)
        flat += v
    return counts, flat


def keys_from_columns(cols: dict, store, path: str) -> NodeKeys | None:
    """The keys a file holds (``cols``: ``keys``, ``key_sources``, ``keys_rule`` (the file's
    metadata) and ``keys_rule_rows`` (the per-row column) as the readers give them) for ``store``
    (its ids, sources, dimension and device), or ``None`` when it holds none. The rule comes from
    the file's metadata, else from the rows, else it is :data:`DEFAULT_RULE` (with a warning).
    Raises ``ValueError`` naming the path for keys without their sources, a rule that the rows
    and the metadata disagree on, a count or dimension that does not match, a non-finite or zero
    vector, or a node whose keys do not hold each of its sources exactly once."""
    kcol, scol = cols.get("keys"), cols.get("key_sources")
    if kcol is None and scol is None:
        return None
    if kcol is None or scol is None:
        has = lambda c: "present" if c is not None else "missing"  # noqa: E731
        raise ValueError(f"{path}: keys must come with key_sources, got keys {has(kcol)}, key_sources {has(scol)}")
    n, dim = len(store), store.dim
    counts, flat = _node_lists(kcol, n, "keys", path, store.ids)
    if not counts.any():
        return None
    rule = keys_rule_of(cols.get("keys_rule"), cols.get("keys_rule_rows"), path)
    s_counts, s_flat = _node_lists(scol, n, "key_sources", path, store.ids)
    bad = np.flatnonzero(counts != s_counts)
    if bad.size:
        j = int(bad[0])
        raise ValueError(f"{path}: key_sources of node {store.ids[j]!r} must have one list per key ({counts[j]}), "
                         f"got {s_counts[j]}")
    mk = rule["max_keys"]
    if mk is not None and int(counts.max()) > mk:
        j = int(np.flatnonzero(counts > mk)[0])
        raise ValueError(f"{path}: node {store.ids[j]!r} must hold at most max_keys={mk} keys (the keys' rule), "
                         f"got {int(counts[j])}")
    vec = _vectors(flat, int(counts.sum()), dim, path, store.ids, counts)
    src = s_flat if isinstance(s_flat, pa.Array) else pa.array(s_flat, type=pa.large_list(pa.large_string()))
    keys = NodeKeys.from_lists(counts, vec.to(store.device), src, **rule)
    try:
        keys.check(store.sources.arrow, store.ids.arrow)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    return keys


def keys_rule_of(meta, rows, path: str) -> dict:
    """The keys' rule from the file's metadata and its per-row column (see keys_from_columns)."""
    from_meta = keys_rule_from_json(meta if isinstance(meta, str) else meta.decode("utf-8"), path) \
        if meta is not None else None
    from_rows = None
    if rows is not None:
        vals = rows.drop_null().unique().to_pylist() if isinstance(rows, (pa.Array, pa.ChunkedArray)) else \
            list(dict.fromkeys(v for v in rows if v is not None))
        found = [keys_rule_from_json(v, path) for v in vals]
        if len({(r["text_weight"], r["max_keys"]) for r in found}) > 1:
            raise ValueError(f"{path}: keys_rule must be the same on every row, got {vals[:2]}")
        from_rows = found[0] if found else None
    if from_meta is not None and from_rows is not None and from_meta != from_rows:
        raise ValueError(f"{path}: the keys' rule in the file's metadata ({PARQUET_KEYS_KEY.decode()}: {from_meta}) "
                         f"must equal the keys_rule column's, got {from_rows}")
    if from_meta is None and from_rows is None:
        log.warning("%s: the keys' rule is missing (neither the file's metadata nor a keys_rule column holds it): "
                    "searched by the default rule %s", path, DEFAULT_RULE)
        return dict(DEFAULT_RULE)
    return from_meta if from_meta is not None else from_rows


def _vectors(flat, m: int, dim: int, path: str, ids, counts: np.ndarray) -> torch.Tensor:
    """The key vectors, (m, dim) float32 unit rows (float or int8 codes, :mod:`.codes`); a bad one
    names its node."""
    owner = lambda j: ids[int(np.repeat(np.arange(len(counts)), counts)[j])]  # noqa: E731
    if isinstance(flat, pa.Array):
        lengths = pc.list_value_length(flat).to_numpy(zero_copy_only=False) if m else np.zeros(0)
        values = pc.cast(flat.flatten(), pa.float64()).to_numpy(zero_copy_only=False) if m else np.zeros(0)
    else:
        lengths = np.array([len(v) if isinstance(v, list) else -1 for v in flat], dtype=np.int64)
        bad = [j for j, v in enumerate(flat) if isinstance(v, list) and not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)]
        if bad:
            raise ValueError(f"{path}: keys of node {owner(bad[0])!r} must be lists of numbers")
        values = np.array([x for v in flat if isinstance(v, list) for x in v], dtype=np.float64) \
            if (lengths == dim).all() else None
    if m and not (lengths == dim).all():
        j = int(np.flatnonzero(lengths != dim)[0])
        raise ValueError(f"{path}: keys must have the store's dimension ({dim}), got a key of "
                         f"{int(lengths[j])} in node {owner(j)!r}")
    v = torch.from_numpy(np.array(values, dtype=np.float32).reshape(m, dim))
    norms = v.double().norm(dim=1)
    bad = ~torch.isfinite(norms) | (norms <= 1e-12)
    if m and bool(bad.any()):
        j = int(torch.nonzero(bad)[0])
        raise ValueError(f"{path}: keys must be finite non-zero vectors, got a NaN, inf or zero key in node "
                         f"{owner(j)!r}")
    if not m or bool(((norms - 1.0).abs() <= 1e-6).all()):
        return v  # unit rows already: a write / read round trip keeps them bit for bit
    return (v.double() / norms[:, None]).float()
