"""Parquet row groups handed to the writer in pieces (store/parquet.py ``write_rows``): the
same row groups and values as one ``write_table``, bytes that do not depend on how the table
is chunked, and no piece longer than ``WRITE_PIECE_ROWS``."""
import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import memforest_gpu.store.parquet as pq_mod


def _table(n: int, d: int = 8) -> pa.Table:
    rng = np.random.default_rng(0)
    counts = rng.integers(0, 4, n)
    offs = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    inner = pa.FixedSizeListArray.from_arrays(pa.array(rng.integers(-127, 128, int(offs[-1]) * d, dtype=np.int8)), d)
    return pa.table({
        "id": pa.array([f"n{i}" for i in range(n)]),
        "embedding": pa.FixedSizeListArray.from_arrays(pa.array(rng.integers(-127, 128, n * d, dtype=np.int8)), d),
        "keys": pa.ListArray.from_arrays(pa.array(offs), inner, mask=pa.array(counts == 0)),
    })


def _write(table: pa.Table, row_group: int) -> bytes:
    f = io.BytesIO()
    with pq.ParquetWriter(f, table.schema, compression="zstd") as w:
        pq_mod.write_rows(w, table, row_group)
    return f.getvalue()


def test_pieces_keep_the_row_groups_and_values_and_ignore_the_chunking(monkeypatch):
    monkeypatch.setattr(pq_mod, "WRITE_PIECE_ROWS", 16)
    t = _table(300)
    one = _write(t, 100)
    rechunked = pa.Table.from_batches(t.to_batches(max_chunksize=37))  # chunks across the pieces' cuts
    assert _write(rechunked, 100) == one
    back = pq.ParquetFile(io.BytesIO(one))
    assert [back.metadata.row_group(i).num_rows for i in range(back.num_row_groups)] == [100, 100, 100]
    assert back.read().equals(t)


def test_the_writer_is_handed_pieces_no_longer_than_the_bound(monkeypatch):
    monkeypatch.setattr(pq_mod, "WRITE_PIECE_ROWS", 16)
    handed = []

    class Spy:
        def write_table(self, table, row_group_size):
            handed.append(([len(c) for c in table.column(0).chunks], row_group_size))

    pq_mod.write_rows(Spy(), _table(70), 50)
    assert handed == [([16, 16, 16, 2], 50), ([16, 4], 50)]


def test_an_empty_table_writes_its_schema():
    t = _table(0)
    assert pq.read_table(io.BytesIO(_write(t, 10))).schema == t.schema
