"""Validation of a store's columns (:meth:`MemoryStore.from_columns`): vectorised over Arrow
arrays, each error naming the first bad node and the rule."""
from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from .columns import ArrowView, TenantView, _encode_tenants, _identity_sources, _large_str, dumps_meta
from .timeutil import EPOCH_MAX, EPOCH_MIN, parse_timestamp

DEFAULT_TENANT = "default"


def _is_iso(s: str) -> bool:
    """A timestamp string that is not a number (so it was read as ISO 8601)."""
    try:
        float(s)
    except ValueError:
        return True
    return False


def _is_arrow(x) -> bool:
    return isinstance(x, (pa.Array, pa.ChunkedArray, ArrowView))


def _first(mask) -> int:
    return int(np.flatnonzero(np.asarray(mask))[0])


def _check_ids(ids):
    """Ids as a large_string array: non-empty strings (ints are turned into strings), unique."""

    if _is_arrow(ids) and (arr := _large_str(ids)) is not None:
        bad = pc.or_kleene(arr.is_null(), pc.equal(pc.utf8_length(arr), 0)).fill_null(True)
        if pc.any(bad).as_py():
            first_bad = arr[_first(bad.to_numpy(zero_copy_only=False))].as_py()
            raise ValueError(f"id must be a non-empty string, got {first_bad!r}")
    else:
        out = []
        for i in ids:
            if isinstance(i, np.integer):
                i = int(i)
            if not isinstance(i, (str, int)) or isinstance(i, bool) or str(i) == "":
                raise ValueError(f"id must be a non-empty string, got {i!r}")
            out.append(str(i))
        arr = pa.array(out, type=pa.large_string())
    if pc.count_distinct(arr).as_py() != len(arr):
        seen: set[str] = set()
        for i in arr.to_pylist():
            if i in seen:
                raise ValueError(f"ids must be unique, got duplicate id {i!r}")
            seen.add(i)
    return arr


def _check_texts(texts, ids):
    if _is_arrow(texts):
        arr = _large_str(texts)
        bad = pc.or_kleene(arr.is_null(), pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(arr)), 0)).fill_null(True)
        if pc.any(bad).as_py():
            j = _first(bad.to_numpy(zero_copy_only=False))
            raise ValueError(f"text of node {ids[j].as_py()!r} must be a non-empty string, got {arr[j].as_py()!r}")
        return arr
    for j, t in enumerate(texts):
        if not isinstance(t, str) or not t.strip():
            raise ValueError(f"text of node {ids[j].as_py()!r} must be a non-empty string, got {t!r}")
    return pa.array(list(texts), type=pa.large_string())


def _check_timestamps(timestamps, ids) -> tuple[np.ndarray, str | None]:
    """(epoch seconds (N,) float64, time_format). Numeric arrays are checked vectorised."""

    if isinstance(timestamps, torch.Tensor):
        timestamps = timestamps.detach().cpu().numpy()
    if isinstance(timestamps, np.ndarray) and timestamps.dtype.kind in "fiu":
        ts = timestamps.astype(np.float64)
        bad = ~(np.isfinite(ts) & (ts >= EPOCH_MIN) & (ts <= EPOCH_MAX))
        if bad.any():
            j = _first(bad)
            v = timestamps[j].item()
            parse_timestamp(v, where=f"timestamp of node {ids[j].as_py()!r}")  # raises with the message
        return ts, None
    vals = list(timestamps)
    ts = np.array([parse_timestamp(v, where=f"timestamp of node {ids[j].as_py()!r}") for j, v in enumerate(vals)],
                  dtype=np.float64)
    return ts, ("iso" if all(isinstance(v, str) and _is_iso(v) for v in vals) else None)


def _check_tenants(tenants, ids) -> tuple[list[str], np.ndarray]:
    n = len(ids)
    if tenants is None:
        return [DEFAULT_TENANT], np.zeros(n, dtype=np.int64)
    if isinstance(tenants, TenantView):
        return tenants.names, tenants.codes
    if _is_arrow(tenants):
        arr = _large_str(tenants)
        arr = pc.if_else(pc.or_kleene(arr.is_null(), pc.equal(pc.utf8_length(arr), 0)).fill_null(True),
                         pa.scalar(None, pa.large_string()), arr)
        empty = pc.equal(pc.utf8_length(_large_str(tenants)), 0).fill_null(False)
        if pc.any(empty).as_py():
            j = _first(empty.to_numpy(zero_copy_only=False))
            raise ValueError(f"tenant of node {ids[j].as_py()!r} must be a non-empty string, got ''")
        return _encode_tenants(arr.fill_null(DEFAULT_TENANT))
    out = []
    for j, t in enumerate(tenants):
        if t is None or (isinstance(t, float) and math.isnan(t)):
            t = DEFAULT_TENANT
        if not isinstance(t, (str, int)) or isinstance(t, bool) or str(t) == "":
            raise ValueError(f"tenant of node {ids[j].as_py()!r} must be a non-empty string, got {t!r}")
        out.append(str(t))
    return _encode_tenants(out)


def _check_sources(sources, ids):
    """list<large_string> sources: each a non-empty list of ids (null = [id]); no original twice."""

    if sources is None:
        return _identity_sources(ids)
    if _is_arrow(sources) and not pa.types.is_string(_arrow_type(sources)):
        arr = sources.arrow if isinstance(sources, ArrowView) else sources
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
        arr = arr.cast(pa.large_list(pa.large_string()))
        if arr.null_count:  # null = [id]
            fill = _identity_sources(ids)
            arr = pc.if_else(arr.is_null(), fill, arr)
        lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
        if (lengths == 0).any():
            j = _first(lengths == 0)
            raise ValueError(f"sources of node {ids[j].as_py()!r} must be a non-empty list of ids, got []")
        values = arr.flatten()
        if values.null_count:
            arr = pa.array(arr.to_pylist(), type=pa.large_list(pa.large_string()))  # error path below
            return _check_sources(arr.to_pylist(), ids)
        if pc.count_distinct(values).as_py() != len(values):
            _overlap_error(arr.to_pylist(), ids)
        return arr
    out = []
    for j, s in enumerate(sources):
        i = ids[j].as_py()
        if s is None:
            s = [i]
        if isinstance(s, np.ndarray):
            s = s.tolist()
        if isinstance(s, str) or not isinstance(s, (list, tuple)) or not s:
            raise ValueError(f"sources of node {i!r} must be a non-empty list of ids, got {s!r}")
        out.append([str(x) for x in s])
    arr = pa.array(out, type=pa.large_list(pa.large_string()))
    values = arr.flatten()
    if pc.count_distinct(values).as_py() != len(values):
        _overlap_error(out, ids)
    return arr


def _arrow_type(x):
    return (x.arrow if isinstance(x, ArrowView) else x).type


def _overlap_error(sources: list, ids) -> None:
    owner: dict[str, str] = {}
    for j, s in enumerate(sources):
        i = ids[j].as_py()
        for x in s:
            if x in owner:
                raise ValueError(f"sources must not overlap, got original {x!r} in both {owner[x]!r} and {i!r}")
            owner[x] = i


def _check_metadata(metadata, ids) -> ArrowView:
    """Metadata as JSON text of objects. An Arrow string column is JSON text already (null
    and ``""`` mean ``{}``); only its rows other than ``{}`` are parsed (checked to be
    objects) and rewritten in this package's JSON form."""

    n = len(ids)
    if metadata is None:
        return ArrowView(pa.array(np.full(n, "{}", dtype=object), type=pa.large_string()))
    if _is_arrow(metadata) and pa.types.is_string(_arrow_type(metadata)) or (
            _is_arrow(metadata) and pa.types.is_large_string(_arrow_type(metadata))):
        arr = _large_str(metadata)
        arr = arr.fill_null("{}")
        empty = pc.equal(arr, "")
        arr = pc.if_else(empty, pa.scalar("{}", pa.large_string()), arr)
        todo = np.flatnonzero(~pc.equal(arr, "{}").to_numpy(zero_copy_only=False))
        if len(todo) == 0:
            return ArrowView(arr)
        vals = arr.to_pylist() if len(todo) > n // 4 else None
        fixed = []
        for j in todo.tolist():
            s = vals[j] if vals is not None else arr[j].as_py()
            try:
                m = json.loads(s)
            except json.JSONDecodeError as e:
                raise ValueError(f"metadata of node {ids[j].as_py()!r} is not valid JSON: {e}") from None
            if not isinstance(m, dict):
                raise ValueError(f"metadata of node {ids[j].as_py()!r} must be a JSON object, got {m!r}")
            fixed.append(dumps_meta(m, ids[j].as_py()))
        out = np.asarray(arr.to_numpy(zero_copy_only=False), dtype=object)
        out[todo] = fixed
        return ArrowView(pa.array(out, type=pa.large_string()))
    out = []
    for j, m in enumerate(metadata):
        if m is None:
            m = {}
        if not isinstance(m, dict):
            raise ValueError(f"metadata of node {ids[j].as_py()!r} must be a JSON object, got {m!r}")
        out.append("{}" if not m else dumps_meta(m, ids[j].as_py()))
    return ArrowView(pa.array(out, type=pa.large_string()))
