"""The groups of a budgeted run (:mod:`memforest_gpu.runs.budgeted`): budget sizes, the per-node
working-set estimate, the tenant column scan and the packing of whole tenants into groups."""
from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass

import numpy as np

__all__ = ["node_bytes", "group_capacity", "output_batch_rows", "scan_tenants",
           "pack_groups", "TenantScan", "parts_dir"]

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..store.jsonl import iter_jsonl_objects, short_repr
from ..store.layout import HEADER_KEY, REQUIRED_COLUMNS
from ..store.memory_store import DEFAULT_TENANT
from ..store.parquet import ROW_GROUP_ROWS as OUTPUT_ROW_GROUP  # the in-memory write_store's row group

log = logging.getLogger("memforest_gpu")

# Working set of one node while a group is compressed, as a multiple of its float32 vector
# (4*D bytes) plus a fixed part (ids, texts, sources, metadata as Python objects). Measured
# (not quiet, 2 cores, D = 384, `--embedder none --kmeans two-level --schedule matching` or
# exact k-means for the small runs): whole-process peak RSS less the 408 MB of a 500-node run,
# per node: 23.5 KB (20,000 nodes, 8 tenants, one of half), 19.2 KB (60,000, same shape),
# 46 KB (200,000 nodes over 20,000 heavy-tailed tenants, in memory) and 39.5 KB (the same
# store under --memory-budget 1G: groups of <= 29,700 nodes, peak 1,580 MB). The many-tenant
# figure sets the factor: (39.5 KB - 2 KB) / 1.5 KB = 25 vectors.
VECTOR_FACTOR = 25.0
NODE_FIXED_BYTES = 2048
# what the process holds besides the group: interpreter, torch, the tenant scan
BASELINE_BYTES = 400 << 20
PART_BATCH_ROWS = 8192  # rows per record batch in the Arrow IPC parts
SPLIT_BATCH_ROWS = 65536  # rows per record batch read while splitting a Parquet input
OUTPUT_ROW_FIXED = 1024  # bytes of an output row besides its vector (id, text, sources, metadata)
PARTS_SUFFIX = ".parts"
KEY = "__key"

def node_bytes(dim: int) -> int:
    """Estimated bytes one node of dimension ``dim`` takes while its group is compressed."""
    return int(4 * dim * VECTOR_FACTOR + NODE_FIXED_BYTES)


def output_batch_rows(budget: int, dim: int) -> int:
    """Rows per batch of the final write: write_store's row group (then a Parquet output is
    byte for byte the in-memory run's), fewer when half the group capacity cannot hold
    that many (each output row is held about three times while a batch is assembled; the
    file then has smaller row groups, with the same rows)."""
    return int(max(1, min(OUTPUT_ROW_GROUP, group_capacity(budget) // 2 // (3 * 4 * dim + OUTPUT_ROW_FIXED))))


def group_capacity(budget: int) -> int:
    """Bytes a group may use: the budget less the process baseline, but at least half the
    budget (a tiny budget still packs groups)."""
    return max(budget - BASELINE_BYTES, budget // 2)


def parts_dir(output: str | os.PathLike) -> str:
    """The folder beside ``output`` that holds a budgeted run's parts until it finishes."""
    return os.fspath(output) + PARTS_SUFFIX


# ------------------------------------------------------------------------------ scan
@dataclass(frozen=True)
class TenantScan:
    """The tenant column of a store, read without the rest.

    - names: tenants in order of first appearance (T,)
    - sizes: nodes per tenant (T,) int64
    - row_tenant: tenant code of each input row (N,) int64
    - dim: the vectors' dimension (384 when the file holds none: they are embedded on load)
    - header: JSONL only, the raw ``__memforest__`` header line (or ``None``)
    """

    names: list
    sizes: np.ndarray
    row_tenant: np.ndarray
    dim: int
    header: bytes | None = None


def scan_tenants(path: str, fmt: str) -> TenantScan:
    """Read only the tenant column (Parquet: in record batches) of the store at ``path``."""
    return _scan_parquet(path) if fmt == "parquet" else _scan_jsonl(path)


def _tenant_name(t) -> str:
    if t is None or (isinstance(t, float) and math.isnan(t)):
        return DEFAULT_TENANT
    return str(t)


def _scan_parquet(path: str) -> TenantScan:

    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{path}: cannot read as Parquet: {e}") from None
    schema = pf.schema_arrow
    code: dict[str, int] = {}
    chunks = []
    if "tenant" not in schema.names:
        n = pf.metadata.num_rows
        code[DEFAULT_TENANT] = 0
        chunks.append(np.zeros(n, dtype=np.int64))
    else:
        simple = pa.types.is_string(schema.field("tenant").type) or pa.types.is_large_string(
            schema.field("tenant").type) or pa.types.is_integer(schema.field("tenant").type)
        for batch in pf.iter_batches(batch_size=SPLIT_BATCH_ROWS, columns=["tenant"]):
            col = batch.column(0)
            if simple:  # vectorised: dictionary-encode the batch, map its few names to codes
                enc = pc.fill_null(pc.cast(col, pa.string()), DEFAULT_TENANT).dictionary_encode()
                local = np.array([code.setdefault(v, len(code)) for v in enc.dictionary.to_pylist()],
                                 dtype=np.int64)
                chunks.append(local[enc.indices.to_numpy(zero_copy_only=False)] if len(local) else
                              np.zeros(0, dtype=np.int64))
            else:  # other types (floats, ...): the store's own rule, per value
                chunks.append(np.array([code.setdefault(_tenant_name(t), len(code)) for t in col.to_pylist()],
                                       dtype=np.int64))
    row_tenant = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int64)
    dim = 384
    if "embedding" in schema.names:
        t = schema.field("embedding").type
        if pa.types.is_fixed_size_list(t):
            dim = t.list_size
        else:
            for batch in pf.iter_batches(batch_size=16, columns=["embedding"]):
                first = batch.column(0)[0].as_py() if len(batch) else None
                dim = len(first) if first else dim
                break
    names = list(code)
    return TenantScan(names, np.bincount(row_tenant, minlength=len(names)).astype(np.int64), row_tenant, dim)


def _jsonl_items(path: str):
    """``(raw line or None, record)`` of a JSONL file (or a JSON array file, whose items have
    no raw line). A record that is not a JSON object, or lacks a required column, raises
    the store reader's ``ValueError`` (naming the line of ``path``)."""

    with open(path, "rb") as f:
        head = f.read(4096).lstrip(b"\xef\xbb\xbf").lstrip()
    if head.startswith(b"["):
        with open(path, encoding="utf-8-sig") as f:
            items = [(f"item {j}", None, rec) for j, rec in enumerate(json.load(f))]
    else:
        items = ((where, None, rec) for where, rec in iter_jsonl_objects(path))
    first = True
    for where, raw, rec in items:
        if not isinstance(rec, dict):
            raise ValueError(f"{path}: {where} must be a JSON object, got {type(rec).__name__}: {short_repr(rec)}")
        if not (first and HEADER_KEY in rec):
            for key in REQUIRED_COLUMNS:
                if key not in rec:
                    raise ValueError(f"{path}: {where} is missing required column {key!r}")
        first = False
        yield raw, rec


def _scan_jsonl(path: str) -> TenantScan:
    code: dict[str, int] = {}
    rows: list[int] = []
    dim, header, first = 384, None, True
    for raw, rec in _jsonl_items(path):
        if first and isinstance(rec, dict) and HEADER_KEY in rec:
            header = raw if raw is not None else json.dumps(rec, ensure_ascii=False).encode("utf-8") + b"\n"
            first = False
            continue
        first = False
        t = rec.get("tenant") if isinstance(rec, dict) else None
        rows.append(code.setdefault(_tenant_name(t), len(code)))
        if dim == 384 and isinstance(rec, dict) and isinstance(rec.get("embedding"), list) and rec["embedding"]:
            dim = len(rec["embedding"])
    row_tenant = np.array(rows, dtype=np.int64)
    names = list(code)
    return TenantScan(names, np.bincount(row_tenant, minlength=len(names)).astype(np.int64), row_tenant, dim,
                      header)


# ---------------------------------------------------------------------------- groups
def pack_groups(sizes: np.ndarray, per_node: int, capacity: int) -> tuple[list[np.ndarray], list[tuple[int, int]]]:
    """Tenants (codes, in order) packed into consecutive groups of at most ``capacity``
    bytes at ``per_node`` bytes a node.

    Returns (groups: one int64 array of tenant codes each, over: ``(code, bytes)`` of each
    tenant that exceeds ``capacity`` alone; it is a group of its own).
    Shape: sizes (T,) -> groups [(T_g,)]
    """
    if per_node <= 0 or capacity <= 0:
        raise ValueError(f"per_node and capacity must be > 0, got {per_node} and {capacity}")
    groups: list[np.ndarray] = []
    over: list[tuple[int, int]] = []
    cur: list[int] = []
    used = 0
    for t, n in enumerate(np.asarray(sizes, dtype=np.int64).tolist()):
        need = n * per_node
        if need > capacity:
            over.append((t, need))
        if cur and used + need > capacity:
            groups.append(np.array(cur, dtype=np.int64))
            cur, used = [], 0
        cur.append(t)
        used += need
    if cur:
        groups.append(np.array(cur, dtype=np.int64))
    return groups, over
