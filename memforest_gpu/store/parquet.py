"""Parquet store files: columns read in record batches, written in row groups (the layout is
in :mod:`.io`). No Python object per row, so millions of rows are fine."""
from __future__ import annotations

import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from ..heap import release_free_heap
from .codes import int8_codes
from .embedder_io import EMBEDDER_COLUMN, PARQUET_EMBEDDER_KEY, embedder_arrow, file_embedder
from .event_trees import event_trees_json, tree_column
from .keys import keys_rule_json
from .keys_io import PARQUET_KEYS_KEY, keys_arrow
from .layout import OPTIONAL_COLUMNS, REQUIRED_COLUMNS
from .mapped_texts import SpillError, TextSpill, text_spill
from .memory_store import DEFAULT_TENANT, MemoryStore

__all__ = ["vector_codes_of", "read_parquet_columns", "to_arrow_table", "write_parquet", "write_rows", "ROW_GROUP_ROWS",
           "arrow_schema", "arrow_rows", "write_parquet_store", "PARQUET_EMBEDDER_KEY", "PARQUET_EVENT_TREES_KEY"]

# the event trees (:mod:`.event_trees`), under the key stores have always used
PARQUET_EVENT_TREES_KEY = b"memforest.forest"
_BATCH_ROWS = 1 << 13  # rows per record batch read: 12.6 MB of d = 384 vectors decoded at a time, not 100
_READ_BUFFER = 1 << 22  # bytes of the Parquet reader's stream buffer per column
ROW_GROUP_ROWS = 1 << 16  # rows per Parquet row group written (a reader can stream the file)
# rows the Parquet writer is handed at once within a row group: it builds the repetition and
# definition levels of all it is handed (two int16 per value: 65,536 rows of 384-d keys, 0.5 GB)
WRITE_PIECE_ROWS = 1 << 12


def _tenant_mask(pf, want: list[str], path: str):
    """Rows of ``want`` tenants: one pass over the tenant column alone. Returns (count, per-batch
    masks) for the batches :func:`read_parquet_columns` reads, or raises naming the tenants."""

    names: dict[str, None] = {}
    masks, count = [], 0
    has = "tenant" in pf.schema_arrow.names
    for rb in pf.iter_batches(batch_size=_BATCH_ROWS, columns=["tenant"] if has else ["id"]):
        if has:
            col = pc.cast(rb.column(0), pa.large_string())
            col = pc.if_else(pc.equal(col, ""), pa.scalar(None, pa.large_string()), col).fill_null(DEFAULT_TENANT)
        else:
            col = pa.array(np.full(rb.num_rows, DEFAULT_TENANT, dtype=object), type=pa.large_string())
        names.update(dict.fromkeys(col.unique().to_pylist()))
        m = pc.is_in(col, value_set=pa.array(want, type=pa.large_string()))
        masks.append(m)
        count += pc.sum(m).as_py() or 0
    for t in want:
        if t not in names:
            # first appearance order, as the store names them
            raise ValueError(f"{path}: tenant must be one of {_first_appearance(pf, has)}, got {t!r}")
    return count, masks


def _first_appearance(pf, has: bool) -> list[str]:
    if not has:
        return [DEFAULT_TENANT]
    col = pc.cast(pf.read(columns=["tenant"]).column(0), pa.large_string()).combine_chunks()
    col = pc.if_else(pc.equal(col, ""), pa.scalar(None, pa.large_string()), col).fill_null(DEFAULT_TENANT)
    return col.dictionary_encode().dictionary.to_pylist()


def read_parquet_columns(path: str, tenants: str | list[str] | None = None, *,
                         mapped_texts: int | None = None) -> tuple[dict, str | None]:
    """The file's columns, read in record batches: ids, texts, tenants, sources and metadata
    as Arrow arrays, embeddings straight into one preallocated float32 (N, D) tensor (no
    Python object per node, no float64 copy). ``tenants``: only those tenants' rows are kept,
    batch by batch (the whole table is never in memory). Texts of ``mapped_texts`` bytes or more
    are a mapped spill file (:mod:`.mapped_texts`; -1: never). Returns (columns, file embedder)."""

    try:
        # buffered, not pre-buffered: a column chunk is streamed through a small buffer instead of
        # being loaded whole (a file written as one row group would otherwise be in memory twice)
        pf = pq.ParquetFile(path, pre_buffer=False, buffer_size=_READ_BUFFER)
        wanted = _wanted_columns(pf.schema_arrow, path)
        if tenants is not None:
            n, masks = _tenant_mask(pf, [tenants] if isinstance(tenants, str) else list(tenants), path)
        else:
            n, masks = pf.metadata.num_rows, None
        _check_vector_column(pf.schema_arrow, wanted, path)
        name = file_embedder(pf, path)
        spill = text_spill(pf, mapped_texts)
        parts, emb = _read_batches(pf, wanted, masks, n, path, spill)
    except (pa.ArrowException, OSError) as e:
        if isinstance(e, SpillError):  # the temporary folder's fault, not the file's
            raise
        raise ValueError(f"{path}: cannot read as Parquet: {e}") from None
    return _columns(parts, emb, pf.schema_arrow, path), name


def _wanted_columns(schema, path: str) -> list[str]:
    """The store's columns the file holds, in layout order, but the model's name (read apart:
    :mod:`.embedder_io`); a missing required one raises."""
    wanted = [c for c in REQUIRED_COLUMNS + OPTIONAL_COLUMNS if c in schema.names and c != EMBEDDER_COLUMN]
    for c in REQUIRED_COLUMNS:
        if c not in schema.names:
            raise ValueError(f"{path}: missing required column {c!r} (columns: {schema.names})")
    return wanted


def _check_vector_column(schema, wanted: list[str], path: str) -> None:
    if "embedding" in wanted:
        et = schema.field("embedding").type
        if not (pa.types.is_list(et) or pa.types.is_large_list(et) or pa.types.is_fixed_size_list(et)):
            raise ValueError(f"{path}: column 'embedding' must be a list of floats, got type {et}")


def _read_batches(pf, wanted: list[str], masks, n: int, path: str,
                  spill: TextSpill | None = None) -> tuple[dict[str, list], torch.Tensor | None]:
    """Every record batch (filtered by ``masks``): the Arrow arrays of each column but the
    vectors (the texts into ``spill`` when there is one), and the vectors in one (n, D) float32
    tensor (``None``: the file has none, or all of them are null and the store is embedded)."""
    parts: dict[str, list] = {c: [] for c in wanted if c != "embedding"}
    if spill is not None:
        parts["text"] = spill
    emb = None  # (n, D) float32, allocated at the first batch with a vector
    state = {"pos": 0, "d": None, "null": None, "first_id": None}
    for b, rb in enumerate(pf.iter_batches(batch_size=_BATCH_ROWS, columns=wanted)):
        if masks is not None:
            rb = rb.filter(masks[b])
        if rb.num_rows == 0:
            continue
        ids_b = rb.column("id")
        for c in parts:
            parts[c].append(rb.column(c))
        if "embedding" in wanted:
            emb = _embeddings_batch(rb.column("embedding"), ids_b, path, n, emb, state)
        state["pos"] += rb.num_rows
    return parts, None if state["null"] else emb  # all-null vectors: embed on load


def _columns(parts: dict[str, list], emb, schema, path: str) -> dict[str, Any]:
    """The store's columns from the batches' arrays: timestamps as epoch seconds, JSON-text
    sources parsed, metadata checked (JSON text) or taken as Python values (struct / map)."""

    def col(c):  # one column's batches, combined and then released (never every column twice)
        if c not in parts:
            return None
        arrs = parts.pop(c)
        if isinstance(arrs, TextSpill):
            return arrs.finish()
        if not arrs:
            return pa.array([], type=schema.field(c).type)
        return pa.chunked_array(arrs, type=arrs[0].type).combine_chunks()

    ids = col("id")
    cols: dict[str, Any] = {
        "id": ids,
        "text": col("text"),
        "timestamp": _parquet_timestamps(col("timestamp"), path),
        "embedding": emb,
        "tenant": col("tenant"),
        "sources": None,
        "metadata": None,
        "tree": col("tree"),
        "event_trees": (schema.metadata or {}).get(PARQUET_EVENT_TREES_KEY),
        "keys": col("keys"),
        "key_sources": col("key_sources"),
        "keys_rule": (schema.metadata or {}).get(PARQUET_KEYS_KEY),
        "keys_rule_rows": col("keys_rule"),
        "vector_codes": vector_codes_of(schema),
    }
    if "sources" in parts:
        c = col("sources")
        if pa.types.is_string(c.type) or pa.types.is_large_string(c.type):
            cols["sources"] = [_json_cell(v, "sources", i, path) for i, v in zip(ids.to_pylist(), c.to_pylist())]
        else:
            cols["sources"] = c
    if "metadata" in parts:
        c = col("metadata")
        if pa.types.is_string(c.type) or pa.types.is_large_string(c.type):
            cols["metadata"] = _metadata_text(c, ids, path)
        else:  # struct / map columns written by other tools
            vals = c.to_pylist()
            if pa.types.is_map(c.type):
                vals = [dict(v) if v is not None else None for v in vals]
            cols["metadata"] = vals
    return cols


def vector_codes_of(schema) -> str:
    """``"int8"`` when the file's vectors are integers, int8 codes (:mod:`.codes`; a tool that
    rewrote them may have widened the type, e.g. to int64), else ``"float32"``."""
    if "embedding" not in schema.names:
        return "float32"
    t = schema.field("embedding").type
    return "int8" if hasattr(t, "value_type") and pa.types.is_integer(t.value_type) else "float32"


def _metadata_text(col, ids, path: str):
    """A JSON-text metadata column as Arrow, with invalid JSON reported as the reader does."""

    todo = np.flatnonzero(~pc.equal(col.fill_null("{}"), "{}").fill_null(True).to_numpy(zero_copy_only=False))
    for j in todo.tolist():  # only rows other than {} are parsed (once more in the store)
        _json_cell(col[j].as_py(), "metadata", ids[j].as_py(), path)
    return col if col.type == pa.large_string() else col.cast(pa.large_string())


def _embeddings_batch(arr, ids, path: str, n: int, emb, state: dict):
    """Copy one batch of the embedding column into ``emb`` (allocated here at the first
    vector: (n, D) float32) at row ``state['pos']``; checks nulls and dimensions, naming the
    node."""
    t = arr.type
    m = len(arr)
    nulls = arr.null_count
    if state["null"] is None:  # the first row decides: vectors everywhere, or nowhere
        state["null"] = bool(arr[0].as_py() is None) if m else None
    if state["null"]:
        if nulls != m:
            # vectors after missing ones: name the first node without one (row 0 of the file)
            raise ValueError(f"{path}: embedding of node {state['first_id']!r} is missing while other nodes have one")
        if state["first_id"] is None:
            state["first_id"] = ids[0].as_py()
        return emb
    if nulls:
        j = int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])
        raise ValueError(f"{path}: embedding of node {ids[j].as_py()!r} is missing while other nodes have one")
    if pa.types.is_fixed_size_list(t):
        d = t.list_size
        if state["d"] is None:
            state["d"], state["d_id"] = d, ids[0].as_py()
    else:
        lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
        if state["d"] is None:
            state["d"], state["d_id"] = int(lengths[0]), ids[0].as_py()
        d = state["d"]
        bad = np.flatnonzero(lengths != d)
        if bad.size:
            j = int(bad[0])
            raise ValueError(
                f"{path}: embeddings must all have the same dimension, node {state['d_id']!r} has {d} "
                f"but node {ids[j].as_py()!r} has {int(lengths[j])}"
            )
    if d == 0:
        raise ValueError(f"{path}: embeddings must have dimension > 0, got 0")
    values = arr.flatten()  # respects slicing/offsets
    if not (pa.types.is_floating(values.type) or pa.types.is_integer(values.type)):
        raise ValueError(f"{path}: column 'embedding' must hold numbers, got type {values.type}")
    if values.null_count:
        j = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0]) // d
        raise ValueError(f"{path}: embedding of node {ids[j].as_py()!r} contains a null value")
    if emb is None:
        emb = torch.empty(n, d, dtype=torch.float32)
    if values.type != pa.float32():
        values = pc.cast(values, pa.float32())
    pos = state["pos"]
    emb.numpy()[pos:pos + m] = values.to_numpy(zero_copy_only=False).reshape(m, d)
    return emb


def _json_cell(v: Any, what: str, node_id: Any, path: str) -> Any:
    if v is None or v == "":
        return None
    if v == "{}":  # the common case, skip the parser
        return {}
    try:
        return json.loads(v)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: {what} of node {node_id!r} is not valid JSON: {e}") from None


def _parquet_timestamps(col, path: str):
    """Timestamp column -> float64 epoch seconds (N,) numpy, or raw values for MemoryStore to
    parse."""

    t = col.type
    if col.null_count:
        return col.to_pylist()  # MemoryStore names the node with the missing value
    if pa.types.is_floating(t) or pa.types.is_integer(t):
        return pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False)
    if pa.types.is_date(t):
        col = pc.cast(col, pa.timestamp("s"))
        t = col.type
    if pa.types.is_timestamp(t):
        per_second = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}[t.unit]
        # Arrow stores instants as UTC counts; naive ones are read as UTC, like ISO strings.
        raw = pc.cast(col, pa.int64()).to_numpy(zero_copy_only=False)
        return raw / per_second
    return col.to_pylist()


def arrow_schema(store: MemoryStore, *, embedder_column: bool = True) -> pa.Schema:
    """The schema of the store's file (the module docstring's layout), with its metadata: the
    embedder, the event trees and the keys' rule; the model's name also as a column when it is
    known (``embedder_column``, :mod:`.embedder_io`)."""
    d = store.dim
    int8 = store.vector_codes == "int8"
    schema_meta = {}
    if store.embedder is not None:
        schema_meta[PARQUET_EMBEDDER_KEY] = str(store.embedder).encode("utf-8")
    fields = [
        ("id", pa.string()),
        ("text", pa.string()),
        ("embedding", pa.list_(pa.int8() if int8 else pa.float32(), d)),
        ("timestamp", pa.float64()),
        ("tenant", pa.string()),
        ("sources", pa.list_(pa.string())),
        ("metadata", pa.string()),
    ]
    if store.event_trees is not None:  # compact's state: the tree column and the per-tenant JSON
        fields.append(("tree", pa.int64()))
        schema_meta[PARQUET_EVENT_TREES_KEY] = event_trees_json(store.event_trees, store.tenant_table).encode("utf-8")
    if store.keys is not None:  # what merged nodes are searched by (.keys): three columns, the rule also in the meta
        kcol, scol, rcol = keys_arrow(store.keys, d, store.vector_codes, rows=(0, 0))
        fields += [("keys", kcol.type), ("key_sources", scol.type), ("keys_rule", rcol.type)]
        schema_meta[PARQUET_KEYS_KEY] = keys_rule_json(store.keys).encode("utf-8")
    if store.embedder is not None and embedder_column:
        fields.append((EMBEDDER_COLUMN, pa.string()))
    return pa.schema(fields, metadata=schema_meta or None)


def arrow_rows(store: MemoryStore, lo: int, hi: int, schema: pa.Schema | None = None) -> pa.Table:
    """Rows ``lo:hi`` of the store as an Arrow table of :func:`arrow_schema`: the store's Arrow
    columns sliced and cast, the vectors a zero-copy view of a float32 host copy of those rows,
    so a file is written a row group at a time without a second copy of every column."""
    schema = schema if schema is not None else arrow_schema(store)
    d = store.dim
    n = hi - lo
    v = store.embeddings[lo:hi]
    if store.vector_codes == "int8":  # int8 codes, a quarter of the bytes (.codes)
        embedding = pa.FixedSizeListArray.from_arrays(pa.array(int8_codes(v).reshape(-1)), d)
    else:
        emb = np.ascontiguousarray(v.detach().to("cpu", torch.float32).numpy())
        embedding = pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), d)
    ts = np.ascontiguousarray(store.timestamps[lo:hi].detach().to("cpu").numpy(), dtype=np.float64)
    cols = store.columns()
    names = pa.array(store.tenant_table, type=pa.string())
    tenant = names.take(pa.array(store.tenant_codes_np[lo:hi], type=pa.int64()))
    arrays = [
        cols["ids"].slice(lo, n).cast(pa.string()),
        cols["texts"].slice(lo, n).cast(pa.string()),
        embedding,
        pa.array(ts),
        tenant,
        cols["sources"].slice(lo, n).cast(pa.list_(pa.string())),
        cols["metadata"].slice(lo, n).cast(pa.string()),
    ]
    if store.event_trees is not None:
        arrays.append(tree_column(store.event_trees.tree[lo:hi]))
    if store.keys is not None:
        arrays += list(keys_arrow(store.keys, d, store.vector_codes, rows=(lo, hi)))
    if EMBEDDER_COLUMN in schema.names:
        arrays.append(embedder_arrow(str(store.embedder), n))
    assert len(ts) == n
    return pa.Table.from_arrays(arrays, schema=schema)


def to_arrow_table(store: MemoryStore):
    """The store as one Arrow table in the file layout but the model's name column: rows to join
    to a file's own (:func:`arrow_rows` reuses the store's Arrow columns, no vector copy)."""
    return arrow_rows(store, 0, len(store), arrow_schema(store, embedder_column=False))


def write_rows(writer: pq.ParquetWriter, table: pa.Table, row_group_size: int | None = None) -> None:
    """Write ``table`` with ``writer`` in row groups of ``row_group_size`` rows (default
    :data:`ROW_GROUP_ROWS`), each handed to the writer as pieces of :data:`WRITE_PIECE_ROWS`
    contiguous rows: the same row groups and values as one ``write_table``, a sixteenth of its
    transient (the levels it builds at once). The pieces are cut at fixed rows, so the bytes
    do not depend on how ``table`` is chunked."""
    n = table.num_rows
    row_group_size = ROW_GROUP_ROWS if row_group_size is None else row_group_size
    if n == 0:
        writer.write_table(table, row_group_size=row_group_size)
        return
    for lo in range(0, n, row_group_size):
        group = table.slice(lo, row_group_size)
        pieces = [group.slice(at, WRITE_PIECE_ROWS).combine_chunks()
                  for at in range(0, group.num_rows, WRITE_PIECE_ROWS)]
        writer.write_table(pa.concat_tables(pieces), row_group_size=row_group_size)
        group = pieces = None


def write_parquet(table, f) -> None:
    """Write an Arrow table (:func:`arrow_rows`) to the open binary file ``f``: zstd, row
    groups of :data:`ROW_GROUP_ROWS` rows (:func:`write_rows`)."""
    with pq.ParquetWriter(f, table.schema, compression="zstd") as w:
        write_rows(w, table)


def write_parquet_store(store: MemoryStore, f, *, first: pa.Table | None = None) -> None:
    """Write ``store`` to the open binary file ``f`` a row group at a time (:func:`arrow_rows`),
    so that no Arrow copy of the whole store is ever held; the same bytes as
    :func:`write_parquet` of ``arrow_rows(store, 0, len(store))`` (zstd, row groups of
    :data:`ROW_GROUP_ROWS` rows). ``first``: the first row group, already built by the
    caller (who builds it before touching the disk)."""
    n = len(store)
    schema = arrow_schema(store) if first is None else first.schema
    with pq.ParquetWriter(f, schema, compression="zstd") as w:
        for lo in range(0, max(n, 1), ROW_GROUP_ROWS):
            hi = min(n, lo + ROW_GROUP_ROWS)
            t = first if lo == 0 and first is not None else arrow_rows(store, lo, hi, schema)
            write_rows(w, t)
            first = t = None  # released before the next row group is built
            release_free_heap()
