"""The model of a store's vectors in its Parquet files: the schema metadata (``memforest.embedder``)
and the ``embedder`` column, the model's name on every row, which a tool that keeps the columns
and drops the file's metadata (pandas, Polars, DuckDB, pyarrow rows) keeps too, so that the
query of a search is embedded by the model of the store's vectors after such a rewrite. (A JSON
Lines store names it in its header line, :mod:`.jsonl`.)"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["PARQUET_EMBEDDER_KEY", "EMBEDDER_COLUMN", "embedder_arrow", "file_embedder"]

PARQUET_EMBEDDER_KEY = b"memforest.embedder"
EMBEDDER_COLUMN = "embedder"
_BATCH_ROWS = 1 << 16


def embedder_arrow(name: str, n: int) -> pa.Array:
    """The column: ``name`` on each of ``n`` rows. Shape: -> (n,) strings"""
    return pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)),
                                          pa.array([name], type=pa.string())).cast(pa.string())


def file_embedder(pf, path: str) -> str | None:
    """The model the Parquet file ``pf`` (a ``pyarrow.parquet.ParquetFile``) records: its schema
    metadata, else its ``embedder`` column (read alone, and only then), else ``None``. A column
    that holds no strings or names two models is refused naming the file."""
    schema = pf.schema_arrow
    name = (schema.metadata or {}).get(PARQUET_EMBEDDER_KEY)
    if name:
        return name.decode("utf-8")
    if EMBEDDER_COLUMN not in schema.names:
        return None
    t = schema.field(EMBEDDER_COLUMN).type
    value = t.value_type if pa.types.is_dictionary(t) else t
    if not (pa.types.is_string(value) or pa.types.is_large_string(value)):
        raise ValueError(f"{path}: column {EMBEDDER_COLUMN!r} must hold the name of the model of the store's vectors "
                         f"(strings), got type {t}")
    names: dict[str, None] = {}
    for rb in pf.iter_batches(batch_size=_BATCH_ROWS, columns=[EMBEDDER_COLUMN]):
        names.update(dict.fromkeys(x for x in pc.unique(rb.column(0)).to_pylist() if x))
    if len(names) > 1:
        raise ValueError(f"{path}: {EMBEDDER_COLUMN} must be the same on every row (the model of the store's "
                         f"vectors), got {list(names)[:2]}")
    return next(iter(names), None)
