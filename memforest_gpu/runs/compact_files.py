"""The files of a compaction: the store, compacted in place, and its inbox of new memories.

A Parquet store in memforest's own layout (what ``compress`` and ``compact`` write) is
compacted without converting the rows of tenants within budget: one pass reads the
tenant column (their counts), a second reads every record batch, keeps the batches as Arrow
and turns only the over-budget tenants' rows into a :class:`MemoryStore`; the output is then
written batch by batch, each untouched row where it was and each compacted row at the row
of its earliest member (:class:`PassThrough`). Any other store (JSON Lines, Parquet with
other column types) is read whole (:func:`read_whole`).

The inbox ``STORE.inbox.jsonl`` holds memories added since (one JSON object per line, the
store's record layout; :class:`~memforest_gpu.runs.compacting_store.CompactingStore` appends to it);
its records' protocol is :mod:`.inbox`, its files' :mod:`.inbox_files`.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..store.embedder_io import EMBEDDER_COLUMN, embedder_arrow, file_embedder
from ..store.event_trees import (
    EventTrees,
    NegativeTreeError,
    event_trees_from_json,
    event_trees_json,
    folded_from_json,
    tree_from_column,
)
from ..store.io import detect_format
from ..store.jsonl import header_forest
from ..store.keys_io import KEY_COLUMNS, PARQUET_KEYS_KEY, keys_from_columns
from ..store.memory_store import MemoryStore
from ..store.parquet import (
    PARQUET_EVENT_TREES_KEY,
    to_arrow_table,
    vector_codes_of,
    write_rows,
)
from .errors import OptionError
from .inbox import StoreIds

__all__ = ["PassThrough", "memforest_layout", "parquet_schema", "placeless", "NoModel", "store_folded"]

_BATCH = 1 << 16


def store_folded(path: str) -> list[dict]:
    """The inbox files the store file ``path`` records as folded in (its event trees JSON's
    ``"inbox"``, :mod:`.inbox_files`), read from its metadata or header only."""
    if detect_format(path) == "parquet":
        text = (parquet_schema(path).metadata or {}).get(PARQUET_EVENT_TREES_KEY)
    else:
        text = header_forest(path)
    return folded_from_json(text, path)


def parquet_schema(path: str):
    """The Arrow schema of the Parquet file ``path``; a file Parquet cannot read is refused
    naming it."""
    try:
        return pq.read_schema(path)
    except (pa.ArrowInvalid, OSError) as e:
        raise ValueError(f"{path} must be a Parquet file (its suffix says it is), got a file Parquet cannot read: "
                         f"{e}") from None


def memforest_layout(schema) -> bool:
    """True when a Parquet schema is the layout memforest writes (the rows can pass through)."""

    want = {"id": pa.string(), "text": pa.string(), "timestamp": pa.float64(), "tenant": pa.string(),
            "sources": pa.list_(pa.string()), "metadata": pa.string()}
    names = set(schema.names)
    if not set(want) <= names or "embedding" not in names or \
            not names <= set(want) | {"embedding", "tree", EMBEDDER_COLUMN, *KEY_COLUMNS}:
        return False
    if EMBEDDER_COLUMN in names and schema.field(EMBEDDER_COLUMN).type != pa.string():
        return False
    if set(KEY_COLUMNS) & names and not _key_columns_ok(schema):
        return False
    if "tree" in names and schema.field("tree").type != pa.int64():
        return False
    et = schema.field("embedding").type
    return all(schema.field(k).type == t for k, t in want.items()) and pa.types.is_fixed_size_list(et) \
        and et.value_type == pa.float32()


def _key_columns_ok(schema) -> bool:
    """Both key columns, as :func:`~memforest_gpu.store.keys_io.keys_arrow` writes them."""
    if not set(KEY_COLUMNS) <= set(schema.names):
        return False
    k, s = schema.field("keys").type, schema.field("key_sources").type
    return pa.types.is_list(k) and pa.types.is_fixed_size_list(k.value_type) and \
        k.value_type.value_type == pa.float32() and pa.types.is_list(s) and pa.types.is_list(s.value_type)


def _null_columns(t, names, schema):
    """``t`` (a table or batch) with each of ``names`` it lacks, as nulls of ``schema``'s type."""
    for c in names:
        if c not in t.schema.names:
            t = t.append_column(schema.field(c), pa.nulls(len(t), schema.field(c).type))
    return t


class PassThrough:
    """A memforest Parquet store read once as Arrow batches; only chosen tenants are converted."""

    def __init__(self, path: str):
        self.path = path
        self.pf = pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 22)
        self.schema = self.pf.schema_arrow
        self.batches: list = []
        self.n = self.pf.metadata.num_rows

    def tenant_counts(self) -> dict[str, int]:
        """Nodes per tenant: the tenant column only."""
        counts: dict[str, int] = {}
        for rb in self.pf.iter_batches(batch_size=_BATCH, columns=["tenant"]):
            vc = rb.column(0).value_counts()
            for name, c in zip(vc.field("values").to_pylist(), vc.field("counts").to_pylist()):
                counts[name] = counts.get(name, 0) + c
        return counts

    def ids_in(self, wanted) -> StoreIds:
        """:class:`~.inbox.StoreIds` of ``wanted`` (Arrow large strings): the id, sources and
        tenant columns in one pass, the text column only when an id names a node."""

        held, lo = StoreIds(), 0
        for rb in self.pf.iter_batches(batch_size=_BATCH, columns=["id", "sources", "tenant"]):
            tenant = rb.column(2)
            held.add(rb.column(0), rb.column(1), lambda j, t=tenant: t[j].as_py(), wanted, lo)
            lo += rb.num_rows
        if held.row:
            at = {r: w for w, r in held.row.items()}
            lo = 0
            for rb in self.pf.iter_batches(batch_size=_BATCH, columns=["text"]):
                for r in [r for r in at if lo <= r < lo + rb.num_rows]:
                    held.text[at[r]] = rb.column(0)[r - lo].as_py()
                lo += rb.num_rows
        return held

    def load(self, tenants: list[str]) -> tuple[MemoryStore | None, np.ndarray]:
        """Read every batch (kept for :meth:`write`); the rows of ``tenants`` as a store with
        their trees and states, and their file rows."""

        want = pa.array(tenants, type=pa.string())
        picked, rows, lo = [], [], 0
        for rb in self.pf.iter_batches(batch_size=_BATCH):
            m = pc.is_in(rb.column("tenant"), value_set=want)
            self.batches.append((lo, rb, m))
            if pc.any(m).as_py():
                picked.append(rb.filter(m))
                rows.append(lo + np.flatnonzero(m.to_numpy(zero_copy_only=False)))
            lo += rb.num_rows
        if not picked:
            return None, np.zeros(0, dtype=np.int64)
        t = pa.Table.from_batches(picked).combine_chunks()
        return self._store(t), np.concatenate(rows)

    def _store(self, t) -> MemoryStore:

        meta = self.schema.metadata or {}
        d = t.schema.field("embedding").type.list_size
        emb = t.column("embedding").chunk(0).flatten().to_numpy(zero_copy_only=False).reshape(len(t), d).copy()
        name = self.embedder()
        st = MemoryStore.from_columns(
            ids=t.column("id").chunk(0), texts=t.column("text").chunk(0),
            timestamps=t.column("timestamp").chunk(0).to_numpy(zero_copy_only=False), embeddings=emb,
            tenants=t.column("tenant").chunk(0),
            sources=t.column("sources").chunk(0).cast(pa.large_list(pa.large_string())),
            metadata=t.column("metadata").chunk(0), embedder=name)
        try:
            tree = tree_from_column(t.column("tree").chunk(0) if "tree" in t.column_names else None, len(st))
        except NegativeTreeError as e:
            raise ValueError(f"{self.path}: node {st.ids[e.row]!r}: {e}") from None
        states = event_trees_from_json(meta.get(PARQUET_EVENT_TREES_KEY), self.path)
        st.event_trees = EventTrees(tree, {k: v for k, v in states.items() if k in st.tenant_table})
        if "keys" in t.column_names:  # what merged nodes are searched by (store/keys.py)
            st.keys = keys_from_columns({"keys": t.column("keys"), "key_sources": t.column("key_sources"),
                                         "keys_rule": meta.get(PARQUET_KEYS_KEY),
                                         "keys_rule_rows": t.column("keys_rule") if "keys_rule" in t.column_names
                                         else None}, st, self.path)
        st.vector_codes = vector_codes_of(self.schema)  # int8 codes stay codes (store/codes.py)
        return st

    def embedder(self) -> str | None:
        """The model of the file's vectors (its metadata, else its embedder column)."""
        if not hasattr(self, "_embedder"):
            self._embedder = file_embedder(self.pf, self.path)
        return self._embedder

    def states(self) -> dict:
        return event_trees_from_json((self.schema.metadata or {}).get(PARQUET_EVENT_TREES_KEY), self.path)

    def write(self, f, out, keys: np.ndarray, drop: np.ndarray, states: dict, folded: list[dict]) -> None:
        """Write the store to the open file ``f``: the kept file rows (``drop``: file rows the
        compaction replaced) and the rows of ``out`` at their ``keys`` (file rows; keys past the
        file's rows come after it), with every tenant's state and the inbox files ``folded``."""

        table = to_arrow_table(out)  # (len(out),) sorted by key
        if "keys" in self.schema.names:  # the file's nodes keep their keys when the new rows have none
            table = _null_columns(table, KEY_COLUMNS, self.schema)
        if EMBEDDER_COLUMN in self.schema.names:  # the model's name on the new rows too
            table = table.append_column(self.schema.field(EMBEDDER_COLUMN),
                                        embedder_arrow(self.embedder() or "", len(table)))
        schema = table.schema
        names = sorted(set(states) | set(out.tenant_table))
        meta = dict(self.schema.metadata or {})
        meta.update(schema.metadata or {})
        meta[PARQUET_EVENT_TREES_KEY] = event_trees_json(EventTrees(np.zeros(0, dtype=np.int64), states, folded),
                                                         names).encode("utf-8")
        schema = schema.with_metadata(meta)
        writer = pq.ParquetWriter(f, schema, compression="zstd")
        dropped = np.zeros(self.n, dtype=bool)
        dropped[drop] = True
        at = 0
        for lo, rb, _ in self.batches + [(self.n, None, None)]:
            hi = lo + (rb.num_rows if rb is not None else 0)
            end = int(np.searchsorted(keys, hi if rb is not None else np.iinfo(np.int64).max, side="left"))
            parts, part_keys = [], []
            if rb is not None:
                keep = np.flatnonzero(~dropped[lo:hi])
                kept = rb.take(pa.array(keep))
                if "tree" not in kept.schema.names:
                    kept = kept.append_column("tree", pa.nulls(len(kept), pa.int64()))
                kept = _null_columns(kept, [c for c in KEY_COLUMNS if c in schema.names], schema)
                parts.append(pa.Table.from_batches([kept.select(schema.names)]).cast(schema))
                part_keys.append(lo + keep)
            if end > at:
                parts.append(table.slice(at, end - at).cast(schema))
                part_keys.append(keys[at:end])
            at = end
            if parts:
                piece = pa.concat_tables(parts).combine_chunks()
                piece = piece.take(pa.array(np.argsort(np.concatenate(part_keys), kind="stable")))
                write_rows(writer, piece)
        writer.close()


def placeless(st: MemoryStore) -> MemoryStore:
    """``st`` with no row in a tree (new memories)."""

    st.event_trees = EventTrees.empty(len(st))
    return st


class NoModel:
    """Stands in for a model when the store's is unknown: inbox records must then carry vectors."""

    name = None
    dim = 0

    def embed(self, texts):
        raise OptionError("inbox records without embeddings need a model: the store records none, pass "
                          "{embedder=default} or {embedder=PATH}")
