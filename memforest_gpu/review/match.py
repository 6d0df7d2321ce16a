"""Whether two store files and a run report belong together, checked before ``memforest
review`` draws a page of them (a page of an unrelated pair would show another store's texts
beside the merged nodes, and figures that are no run's).

:func:`check_stores`: OUTPUT was compressed from INPUT when every source an OUTPUT node names
is a source of INPUT (a compaction's inbox memories are not in the store it read), every
source of INPUT is in some OUTPUT node (a compression merges, it drops nothing), every OUTPUT
node has its sources' tenant, and every OUTPUT node that merged nothing (the same sources as
one INPUT node) holds that node's text.

:func:`check_report`: the report's ``nodes_in`` and ``nodes_out``, and each of its tenant
rows' counts, are the files' own.

Each raises ``ValueError`` with one line that names the file, the node or field, and why.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..store.memory_store import MemoryStore

__all__ = ["check_stores", "check_report"]


def _flat(store: MemoryStore) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """Every source of ``store`` (large strings), the row of each, and each row's count."""
    src = store.sources.arrow
    flat = pc.cast(pc.list_flatten(src), pa.large_string())
    parent = np.asarray(pc.list_parent_indices(src), dtype=np.int64)
    count = np.asarray(pc.list_value_length(src).fill_null(0), dtype=np.int64)
    return flat, parent, count


def check_stores(before: MemoryStore, after: MemoryStore, *, input: str, output: str) -> None:
    """Refuse (``ValueError``) an OUTPUT that was not compressed from INPUT (module docstring)."""
    head = f"OUTPUT {output!r} was not compressed from INPUT {input!r}"
    b_flat, b_row, b_count = _flat(before)
    a_flat, a_row, a_count = _flat(after)
    at = pc.index_in(a_flat, value_set=b_flat)
    missing = np.asarray(at.is_null())
    if missing.any():
        k = int(missing.argmax())
        nodes = len(np.unique(a_row[missing]))
        raise ValueError(f"{head}: {nodes} of its {len(after)} nodes name sources INPUT does not hold (node "
                         f"{after.ids[int(a_row[k])]!r}: source {a_flat[k].as_py()!r}); a compacted store's inbox "
                         "memories are not in the store it read (review a compaction with compact --review PAGE.html)")
    lost = ~np.asarray(pc.is_in(b_flat, value_set=a_flat))
    if lost.any():
        k = int(lost.argmax())
        raise ValueError(f"{head}: {int(lost.sum())} of INPUT's {len(b_flat)} sources are in no node of OUTPUT "
                         f"(INPUT node {before.ids[int(b_row[k])]!r}: source {b_flat[k].as_py()!r}); a compression "
                         "keeps every source in some node")
    rows = b_row[np.asarray(at, dtype=np.int64)]  # the INPUT row of each OUTPUT source
    a_ten = np.asarray(after.tenant_names(), dtype=object)[after.tenant_codes_np][a_row]
    b_ten = np.asarray(before.tenant_names(), dtype=object)[before.tenant_codes_np][rows]
    other = a_ten != b_ten
    if other.any():
        k = int(other.argmax())
        raise ValueError(f"{head}: {len(np.unique(a_row[other]))} of its nodes belong to another tenant than their "
                         f"sources in INPUT (node {after.ids[int(a_row[k])]!r} of tenant {a_ten[k]!r}: source "
                         f"{a_flat[k].as_py()!r} of tenant {b_ten[k]!r})")
    nodes = np.flatnonzero(a_count > 0)
    if not len(nodes):
        return
    starts = np.cumsum(a_count)[nodes] - a_count[nodes]
    lo, hi = np.minimum.reduceat(rows, starts), np.maximum.reduceat(rows, starts)
    same = (lo == hi) & (a_count[nodes] == b_count[lo])  # OUTPUT nodes that merged nothing, and their INPUT rows
    a_idx, b_idx = nodes[same], lo[same]
    differ = ~np.asarray(pc.equal(after.texts.arrow.take(pa.array(a_idx)),
                                  before.texts.arrow.take(pa.array(b_idx))).fill_null(False))
    if differ.any():
        k = int(differ.argmax())
        raise ValueError(f"{head}: {int(differ.sum())} of its {len(a_idx)} nodes that merged nothing hold another "
                         f"text than INPUT's node of the same sources (node {after.ids[int(a_idx[k])]!r})")


def _count(report: dict, field: str, where: str, path: str) -> int | None:
    v = report.get(field)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"--report {path!r}: {where}{field} must be an integer, got {v!r}")
    return v


def check_report(report: dict, before: MemoryStore, after: MemoryStore, *, path: str, input: str,
                 output: str) -> None:
    """Refuse (``ValueError``) a run report whose counts are not the files' (module docstring)."""
    head = f"--report {path!r} does not match the files"
    for field, store, who, name in (("nodes_in", before, "INPUT", input), ("nodes_out", after, "OUTPUT", output)):
        v = _count(report, field, "", path)
        if v is not None and v != len(store):
            raise ValueError(f"{head}: its {field} is {v}, {who} {name!r} holds {len(store)} nodes")
    rows = report.get("tenants") or []
    if not isinstance(rows, list):
        raise ValueError(f"--report {path!r}: tenants must be a list of tenant rows, got {type(rows).__name__}")
    counts = {}
    for field, store in (("nodes_in", before), ("nodes_out", after)):
        names = store.tenant_names()
        counts[field] = dict(zip(names, np.bincount(store.tenant_codes_np, minlength=len(names)).tolist()))
    for r in rows:
        if not isinstance(r, dict) or not isinstance(r.get("tenant"), str):
            raise ValueError(f"--report {path!r}: tenants must hold rows with a tenant name, got {r!r}"[:300])
        for field, who, name in (("nodes_in", "INPUT", input), ("nodes_out", "OUTPUT", output)):
            v = _count(r, field, f"tenant {r['tenant']!r}: ", path)
            n = counts[field].get(r["tenant"], 0)
            if v is not None and v != n:
                raise ValueError(f"{head}: tenant {r['tenant']!r} has {field} {v} there, {who} {name!r} holds {n} "
                                 "of its nodes")
