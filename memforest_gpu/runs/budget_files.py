"""The files of a budgeted run (:mod:`memforest_gpu.runs.budgeted`): the input split into one file
per tenant group in a single streamed pass (with the whole-store checks a group cannot
make), each group's output as an Arrow IPC part keyed by the input row of its earliest
original, and the final output written from the parts in key order, batch by batch."""
from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from ..store.atomic import atomic_open, atomic_write_text
from ..store.event_trees import EventTrees, event_trees_from_json, event_trees_json
from ..store.jsonl import iso_time
from ..store.keys_io import PARQUET_KEYS_KEY
from ..store.layout import HEADER_KEY, OPTIONAL_COLUMNS, REQUIRED_COLUMNS
from ..store.parquet import PARQUET_EVENT_TREES_KEY, arrow_rows, vector_codes_of, write_rows
from .budget_groups import KEY, PART_BATCH_ROWS, SPLIT_BATCH_ROWS, _jsonl_items, output_batch_rows


class _SplitChecks:
    """What the in-memory run checks across the whole store and a group alone cannot see:
    ids unique over all tenants, no original in two nodes' sources, and whether every vector
    is already unit length (else the whole store's vectors are normalised, so a group whose
    vectors all are unit must be normalised too, for the same bits)."""

    def __init__(self, n_groups: int):
        self.keys: list = []  # Arrow arrays of ids (and sources) of every row
        self.has_sources = False
        self.unit = np.ones(n_groups, dtype=bool)  # (G,) every vector of the group is unit length

    def vectors(self, e: np.ndarray, g: np.ndarray) -> None:
        """``e`` (B, D) float32 vectors of rows in groups ``g`` (B,)."""
        norms = np.linalg.norm(e.astype(np.float64), axis=1)
        bad = ~(np.abs(norms - 1.0) <= 1e-6)
        self.unit[np.unique(g[bad])] = False

    def raise_duplicates(self, src: str, ids: list, sources: list | None) -> None:
        """The in-memory run's message for the first duplicate id / overlapping original."""
        seen: set = set()
        for i in ids:
            if i in seen:
                raise ValueError(f"{src}: ids must be unique, got duplicate id {i!r}")
            seen.add(i)
        owner: dict = {}
        for i, srcs in zip(ids, sources or [None] * len(ids)):
            for x in (srcs or [i]):
                if x in owner:
                    raise ValueError(f"{src}: sources must not overlap, got original {x!r} in both {owner[x]!r} "
                                     f"and {i!r}")
                owner[x] = i


def _split_parquet(path: str, row_group: np.ndarray, n_groups: int, paths: list[str]) -> np.ndarray:
    """One pass over ``path`` in record batches; row i goes to ``paths[row_group[i]]``.
    Returns the groups whose vectors are all unit length (G,) bool (see :class:`_SplitChecks`)."""

    pf = pq.ParquetFile(path)
    cols = [c for c in REQUIRED_COLUMNS + OPTIONAL_COLUMNS if c in pf.schema_arrow.names]
    schema = pa.schema([pf.schema_arrow.field(c) for c in cols], metadata=pf.schema_arrow.metadata)
    checks = _SplitChecks(n_groups)
    list_sources = "sources" in cols and (pa.types.is_list(schema.field("sources").type)
                                          or pa.types.is_large_list(schema.field("sources").type))
    writers = [None] * n_groups
    start = 0
    try:
        for batch in pf.iter_batches(batch_size=SPLIT_BATCH_ROWS, columns=cols):
            g = row_group[start:start + len(batch)]
            start += len(batch)
            ids = pc.cast(batch.column("id"), pa.string())
            if list_sources:
                srcs = batch.column("sources")
                has = pc.is_valid(srcs)
                checks.keys += [pc.filter(ids, pc.invert(has)), pc.cast(pc.list_flatten(pc.filter(srcs, has)),
                                                                         pa.string())]
            else:
                checks.keys.append(ids)
            if "embedding" in cols:
                col = batch.column("embedding")
                if not col.null_count and len(col):
                    flat = col.flatten()
                    if not flat.null_count and len(flat) % len(col) == 0:
                        e = pc.cast(flat, pa.float32()).to_numpy(zero_copy_only=False).reshape(len(col), -1)
                        checks.vectors(e, g)
            order = np.argsort(g, kind="stable")
            bounds = np.searchsorted(g[order], np.arange(n_groups + 1))
            for j in np.flatnonzero(np.diff(bounds)).tolist():
                part = pa.Table.from_batches([batch]).take(pa.array(order[bounds[j]:bounds[j + 1]]))
                if writers[j] is None:
                    writers[j] = pq.ParquetWriter(paths[j] + ".tmp", schema, compression="snappy")
                writers[j].write_table(part.cast(schema))
    finally:
        for w in writers:
            if w is not None:
                w.close()
    keys = pa.chunked_array(checks.keys, type=pa.string())
    if len(pc.unique(keys)) != len(keys):
        t = pf.read(columns=["id", "sources"] if list_sources else ["id"])
        checks.raise_duplicates(path, [str(x) for x in t.column("id").to_pylist()],
                                t.column("sources").to_pylist() if list_sources else None)
    for p in paths:
        os.replace(p + ".tmp", p)
    return checks.unit


def _split_jsonl(path: str, header: bytes | None, row_group: np.ndarray, n_groups: int,
                 paths: list[str]) -> np.ndarray:
    """As :func:`_split_parquet` for JSON Lines (records written back as read)."""

    checks = _SplitChecks(n_groups)
    ids, sources = [], []
    files = [open(p + ".tmp", "wb") for p in paths]
    try:
        if header is not None:
            for f in files:
                f.write(header)
        i, first = 0, True
        for raw, rec in _jsonl_items(path):
            if first and isinstance(rec, dict) and HEADER_KEY in rec:
                first = False
                continue
            first = False
            g = row_group[i]
            files[g].write(raw if raw is not None else json.dumps(rec, ensure_ascii=False).encode() + b"\n")
            i += 1
            if isinstance(rec, dict):
                ids.append(str(rec.get("id")))
                sources.append(rec.get("sources") if isinstance(rec.get("sources"), list) else None)
                e = rec.get("embedding")
                if isinstance(e, list) and e and all(isinstance(x, (int, float)) for x in e):
                    checks.vectors(np.asarray([e], dtype=np.float32), np.array([g]))
    finally:
        for f in files:
            f.close()
    checks.raise_duplicates(path, ids, sources)
    for p in paths:
        os.replace(p + ".tmp", p)
    return checks.unit


def _output_keys(sub, out, rows: np.ndarray) -> np.ndarray:
    """Each output node's key: the input row (of the whole file) of the earliest input
    node it holds. ``rows`` (N_g,): the group's input rows, in file order.
    Shape: -> (N_out,) int64"""

    sub_src, out_src = sub.columns()["sources"], out.columns()["sources"]
    # an id's input node: its position among the group's source ids (unique and non-empty: the
    # store checks that), then the list it sits in; the same with Arrow kernels for every id at once
    at = pc.index_in(pc.list_flatten(out_src), value_set=pc.list_flatten(sub_src)).to_numpy(zero_copy_only=False)
    node = pc.list_parent_indices(sub_src).to_numpy(zero_copy_only=False).astype(np.int64)[at]
    starts = pc.list_value_length(out_src).to_numpy(zero_copy_only=False).astype(np.int64).cumsum()
    local = np.minimum.reduceat(node, np.concatenate([[0], starts[:-1]])) if len(node) else node
    return rows[local]


def _write_part(out, keys: np.ndarray, path: str, report, time_format) -> None:

    table = arrow_rows(out, 0, len(out)).append_column(KEY, pa.array(keys, type=pa.int64()))  # the file layout
    d = report.to_dict()
    d["time_format"] = time_format
    d["embedder_label"] = out.embedder
    atomic_write_text(path + ".json", json.dumps(d, default=str))
    np.save(path + ".keys.npy", keys)
    with pa.OSFile(path + ".tmp", "wb") as f, ipc.new_file(f, table.schema) as w:
        w.write_table(table, max_chunksize=PART_BATCH_ROWS)
    os.replace(path + ".tmp", path)


class _PartReader:
    """Rows of one IPC part by local index, reading only the record batches they fall in
    (read from the file, not memory-mapped, so that what was read can be freed)."""

    def __init__(self, path: str):
        self.path = path
        self.file = pa.OSFile(path, "rb")
        self.reader = ipc.open_file(self.file)
        self.cache: dict[int, object] = {}

    def keys(self) -> np.ndarray:
        """(N_part,) int64 output keys, from the sidecar written with the part."""
        return np.load(self.path + ".keys.npy")

    def take(self, local: np.ndarray):
        lo, hi = int(local.min()) // PART_BATCH_ROWS, int(local.max()) // PART_BATCH_ROWS
        for b in [b for b in self.cache if b < lo]:  # rows are taken in increasing order: drop the past
            del self.cache[b]
        batches = []
        for b in range(lo, hi + 1):
            if b not in self.cache:
                self.cache[b] = self.reader.get_batch(b)
            batches.append(self.cache[b])
        return pa.Table.from_batches(batches).take(pa.array(local - lo * PART_BATCH_ROWS))

    def close(self) -> None:
        self.cache.clear()
        self.file.close()


def _write_output(out_paths: list[str], dst: str, fmt: str, time_format, budget: int) -> None:
    """Merge the parts into ``dst`` (atomically), in key order, one batch at a time."""

    readers = [_PartReader(p) for p in out_paths]
    try:
        keys = [r.keys() for r in readers]
        part = np.concatenate([np.full(len(k), j, dtype=np.int64) for j, k in enumerate(keys)])
        local = np.concatenate([np.arange(len(k), dtype=np.int64) for k in keys])
        order = np.argsort(np.concatenate(keys), kind="stable")
        schema = readers[0].reader.schema
        schema = schema.remove(schema.get_field_index(KEY)).with_metadata(_joined_metadata(readers))
        dim = schema.field("embedding").type.list_size
        rows = output_batch_rows(budget, dim)
        with atomic_open(dst) as f:
            if fmt == "parquet":
                writer = pq.ParquetWriter(f, schema, compression="zstd")
            else:
                writer = None
                emb_name = (schema.metadata or {}).get(b"memforest.embedder")
                trees = (schema.metadata or {}).get(PARQUET_EVENT_TREES_KEY)
                header = {"embedder": emb_name.decode("utf-8")} if emb_name is not None else {}
                if trees is not None:
                    header["forest"] = json.loads(trees)
                if (rule := (schema.metadata or {}).get(PARQUET_KEYS_KEY)) is not None:
                    header["keys"] = json.loads(rule)
                if vector_codes_of(schema) == "int8":  # as write_jsonl says int8 codes
                    header["vectors"] = "int8"
                if header:
                    f.write(json.dumps({HEADER_KEY: header}, ensure_ascii=False).encode("utf-8") + b"\n")
            for s in range(0, len(order), rows):
                sel = order[s:s + rows]
                p, loc = part[sel], local[sel]
                pieces, where = [], []
                for j in np.unique(p).tolist():
                    m = np.flatnonzero(p == j)
                    pieces.append(readers[j].take(loc[m]))
                    where.append(m)
                table = pa.concat_tables(pieces).combine_chunks()
                inv = np.empty(len(sel), dtype=np.int64)
                inv[np.concatenate(where)] = np.arange(len(sel))
                table = table.take(pa.array(inv)).drop_columns([KEY])
                if writer is not None:
                    write_rows(writer, table.replace_schema_metadata(schema.metadata), len(table))
                else:
                    f.write(_jsonl_bytes(table, iso=time_format == "iso"))
            if writer is not None:
                writer.close()
    finally:
        for r in readers:
            r.close()


def _joined_metadata(readers) -> dict | None:
    """The parts' schema metadata, with their event trees (one per group of tenants) joined
    into one, as the in-memory run writes it (tenants sorted)."""

    meta = dict(readers[0].reader.schema.metadata or {})
    states = [(r.reader.schema.metadata or {}).get(PARQUET_EVENT_TREES_KEY) for r in readers]
    if any(x is not None for x in states):
        tenants = {}
        for r, x in zip(readers, states):
            tenants.update(event_trees_from_json(x, r.path))
        meta[PARQUET_EVENT_TREES_KEY] = event_trees_json(EventTrees(np.zeros(0, dtype=np.int64), tenants),
                                                         list(tenants)).encode()
    return meta or None


def _jsonl_bytes(table, *, iso: bool) -> bytes:
    """Rows of a part table as the JSONL lines :func:`~memforest_gpu.store.io.write_store`
    writes."""

    ids, texts = table.column("id").to_pylist(), table.column("text").to_pylist()
    ts = table.column("timestamp").to_pylist()
    tenants, sources = table.column("tenant").to_pylist(), table.column("sources").to_pylist()
    meta = table.column("metadata").to_pylist()
    emb = table.column("embedding").combine_chunks().flatten().to_numpy().reshape(len(table), -1)
    lines = []
    for j in range(len(table)):
        rec = {"id": ids[j], "text": texts[j], "timestamp": iso_time(ts[j]) if iso else ts[j], "tenant": tenants[j],
               "sources": list(sources[j]), "metadata": json.loads(meta[j]), "embedding": emb[j].tolist()}
        lines.append(json.dumps(rec, ensure_ascii=False, sort_keys=False))
    if "tree" in table.column_names:  # as write_jsonl writes compact's tree ids
        trees = table.column("tree").to_pylist()
        lines = [ln[:-1] + f', "tree": {"null" if t is None else t}}}' for ln, t in zip(lines, trees)]
    if "keys" in table.column_names:  # as write_jsonl writes the keys of merged nodes
        keys, ksrc = table.column("keys").to_pylist(), table.column("key_sources").to_pylist()
        lines = [ln if k is None else ln[:-1] + ", " + json.dumps({"keys": k, "key_sources": s})[1:]
                 for ln, k, s in zip(lines, keys, ksrc)]
    return ("\n".join(lines) + "\n").encode("utf-8") if lines else b""
