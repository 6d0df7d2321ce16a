"""Tests for memforest_gpu.store.io: Parquet / JSONL round trips, errors, atomic writes."""
from __future__ import annotations

import json
import os
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from memforest_gpu.store.io import FORMATS, detect_format, read_store, write_store
from memforest_gpu.store.memory_store import MemoryStore

D = 8


def make_store(n: int = 5, *, embedder: str | None = "fake-model", seed: int = 0) -> MemoryStore:
    rng = np.random.default_rng(seed)
    ids = [f"m{i}" for i in range(n)]
    return MemoryStore.from_columns(
        ids=ids,
        texts=[f"memory number {i} — café ☕ 日本" for i in range(n)],
        timestamps=[1683554160.123456 + 3600.5 * i for i in range(n)],
        embeddings=rng.standard_normal((n, D)).astype(np.float32),
        tenants=["alice" if i % 2 else "bob" for i in range(n)],
        sources=[[f"m{i}", f"orig{i}a", f"orig{i}b"] if i == 1 else [f"m{i}"] for i in range(n)],
        metadata=[
            {"speaker": "Zoë", "nested": {"a": [1, 2.5, None], "b": {"ü": True}}, "i": i} if i % 2 == 0 else {}
            for i in range(n)
        ],
        embedder=embedder,
        device="cpu",
    )


class FakeEmbedder:
    name = "fake-embedder-v1"

    def __init__(self, dim: int = 4):
        self.dim = dim
        self.calls = 0

    def embed(self, texts):
        self.calls += 1
        out = torch.zeros(len(texts), self.dim)
        for j, t in enumerate(texts):
            out[j, len(t) % self.dim] = 1.0
            out[j, (len(t) + 1) % self.dim] += 0.5
        return out


def assert_same(a: MemoryStore, b: MemoryStore) -> None:
    assert b.ids == a.ids
    assert b.texts == a.texts
    assert b.embeddings.dtype == torch.float32
    assert torch.allclose(b.embeddings, a.embeddings, atol=1e-6)
    assert b.timestamps.dtype == torch.float64
    assert b.timestamps.tolist() == a.timestamps.tolist()  # exact
    assert b.tenants == a.tenants
    assert b.sources == a.sources
    assert b.metadata == a.metadata
    assert b.embedder == a.embedder


def write_jsonl(path, lines) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write((line if isinstance(line, str) else json.dumps(line, ensure_ascii=False)) + "\n")


# ------------------------------------------------------------------ round trips
@pytest.mark.parametrize("suffix", [".parquet", ".pq", ".jsonl", ".json", ".ndjson"])
def test_round_trip(tmp_path, suffix):
    store = make_store()
    path = tmp_path / f"store{suffix}"
    write_store(store, path)
    assert_same(store, read_store(path))


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip_without_embedder_name(tmp_path, fmt):
    store = make_store(embedder=None)
    path = tmp_path / "store.bin"
    write_store(store, path, format=fmt)
    back = read_store(path, format=fmt)
    assert back.embedder is None
    assert_same(store, back)


def test_parquet_schema(tmp_path):
    store = make_store()
    path = tmp_path / "s.parquet"
    write_store(store, path)
    pf = pq.ParquetFile(path)
    schema = pf.schema_arrow
    assert schema.field("id").type == pa.string()
    assert schema.field("embedding").type == pa.list_(pa.float32(), D)
    assert schema.field("timestamp").type == pa.float64()
    assert schema.field("sources").type == pa.list_(pa.string())
    assert schema.field("metadata").type == pa.string()
    assert schema.metadata[b"memforest.embedder"] == b"fake-model"
    assert pf.metadata.row_group(0).column(0).compression.lower() == "zstd"
    meta0 = json.loads(pq.read_table(path).column("metadata")[0].as_py())
    assert meta0["speaker"] == "Zoë"


def test_jsonl_layout(tmp_path):
    store = make_store(n=2)
    path = tmp_path / "s.jsonl"
    write_store(store, path)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert json.loads(lines[0]) == {"__memforest__": {"embedder": "fake-model"}}
    rec = json.loads(lines[1])
    assert rec["id"] == "m0" and isinstance(rec["timestamp"], float)
    assert "Zoë" in lines[1]  # ensure_ascii=False
    assert len(lines) == 3


def test_parquet_variable_list_embeddings_and_other_types(tmp_path):
    """list<double> embeddings, int ids, timestamp-typed and chunked columns are read."""
    path = tmp_path / "other.parquet"
    t1 = pa.table({
        "id": pa.array([1, 2], pa.int64()),
        "text": ["a", "b"],
        "embedding": pa.array([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]], pa.list_(pa.float64())),
        "timestamp": pa.array([datetime(2023, 5, 8, 13, 56, tzinfo=UTC)] * 2, pa.timestamp("ms", "UTC")),
        "extra": [1, 2],
    })
    t2 = pa.table({
        "id": pa.array([3], pa.int64()),
        "text": ["c"],
        "embedding": pa.array([[0.0, 0.0, 3.0]], pa.list_(pa.float64())),
        "timestamp": pa.array([datetime(2023, 5, 9, tzinfo=UTC)], pa.timestamp("ms", "UTC")),
        "extra": [3],
    })
    pq.write_table(pa.concat_tables([t1, t2]), path, row_group_size=2)
    s = read_store(path)
    assert s.ids == ["1", "2", "3"]
    assert torch.allclose(s.embeddings, torch.eye(3))
    assert s.timestamps[0].item() == datetime(2023, 5, 8, 13, 56, tzinfo=UTC).timestamp()
    assert s.tenants == ["default"] * 3 and s.sources == [["1"], ["2"], ["3"]]
    assert s.embedder is None


# ------------------------------------------------------------------ timestamps / embedding on load
def test_jsonl_iso_timestamps(tmp_path):
    path = tmp_path / "iso.jsonl"
    write_jsonl(path, [
        {"id": "a", "text": "hello", "timestamp": "2023-05-08T13:56:00Z", "embedding": [1, 0]},
        {"id": "b", "text": "world", "timestamp": "2023-05-08T13:56:00+02:00", "embedding": [0, 1]},
        {"id": "c", "text": "naive", "timestamp": "2023-05-08 13:56:00", "embedding": [1, 1]},
        {"id": "d", "text": "epoch", "timestamp": 1683554160, "embedding": [1, 2]},
    ])
    s = read_store(path)
    expect = datetime(2023, 5, 8, 13, 56, tzinfo=UTC).timestamp()
    assert expect == 1683554160.0
    assert s.timestamps.tolist() == [expect, expect - 7200, expect, expect]


def test_jsonl_without_embeddings_needs_embedder(tmp_path):
    path = tmp_path / "noemb.jsonl"
    write_jsonl(path, [{"id": "a", "text": "hello", "timestamp": 1.0}, {"id": "b", "text": "bye", "timestamp": 2.0}])
    with pytest.raises(ValueError, match="embedder"):
        read_store(path)


def test_jsonl_without_embeddings_embeds_on_load(tmp_path):
    path = tmp_path / "noemb.jsonl"
    write_jsonl(path, [{"id": "a", "text": "hello", "timestamp": 1.0}, {"id": "b", "text": "bye!!", "timestamp": 2.0}])
    emb = FakeEmbedder()
    s = read_store(path, embedder=emb, device="cpu")
    assert emb.calls == 1
    assert s.embeddings.shape == (2, 4)
    assert torch.allclose(s.embeddings.norm(dim=1), torch.ones(2))
    assert s.embedder == "fake-embedder-v1"


def test_parquet_without_embeddings_embeds_on_load(tmp_path):
    path = tmp_path / "noemb.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["x", "yy"], "timestamp": [1.0, 2.0]}), path)
    s = read_store(path, embedder=FakeEmbedder(), device="cpu")
    assert s.embeddings.shape == (2, 4) and s.embedder == "fake-embedder-v1"
    with pytest.raises(ValueError, match="embedder"):
        read_store(path)


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize("fmt", FORMATS)
def test_missing_required_column(tmp_path, fmt):
    if fmt == "jsonl":
        path = tmp_path / "m.jsonl"
        write_jsonl(path, [{"id": "a", "text": "x", "timestamp": 1.0}, {"id": "b", "text": "y"}])
    else:
        path = tmp_path / "m.parquet"
        pq.write_table(pa.table({"id": ["a"], "text": ["x"]}), path)
    with pytest.raises(ValueError, match="missing required column 'timestamp'") as ei:
        read_store(path)
    assert str(path) in str(ei.value)


def test_bad_json_line_names_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    write_jsonl(path, [{"id": "a", "text": "x", "timestamp": 1.0, "embedding": [1, 0]}, "", '{"id": "b", "text": '])
    with pytest.raises(ValueError, match=r"line 3 is not valid JSON") as ei:
        read_store(path)
    assert str(path) in str(ei.value)


def test_json_value_not_object(tmp_path):
    path = tmp_path / "arr.jsonl"
    write_jsonl(path, [{"id": "a", "text": "x", "timestamp": 1.0, "embedding": [1, 0]}, "[1, 2]"])
    with pytest.raises(ValueError, match=r"line 2 must be a JSON object"):
        read_store(path)


def test_not_a_parquet_file(tmp_path):
    path = tmp_path / "fake.parquet"
    path.write_text("this is not parquet at all\n")
    with pytest.raises(ValueError, match="cannot read as Parquet") as ei:
        read_store(path)
    assert str(path) in str(ei.value)


def test_unknown_suffix_lists_formats(tmp_path):
    path = tmp_path / "store.csv"
    path.write_text("id,text\n")
    with pytest.raises(ValueError, match="parquet") as ei:
        read_store(path)
    assert "jsonl" in str(ei.value)
    with pytest.raises(ValueError, match="jsonl"):
        write_store(make_store(), tmp_path / "out.csv")
    with pytest.raises(ValueError, match="must be one of"):
        detect_format("x.parquet", "csv")


def test_detect_format():
    assert detect_format("a/b.PARQUET") == "parquet"
    assert detect_format("b.pq") == "parquet"
    assert detect_format("b.ndjson") == "jsonl"
    assert detect_format("b.json") == "jsonl"
    assert detect_format("b.whatever", "jsonl") == "jsonl"


def test_duplicate_ids(tmp_path):
    path = tmp_path / "dup.jsonl"
    write_jsonl(path, [
        {"id": "a", "text": "x", "timestamp": 1.0, "embedding": [1, 0]},
        {"id": "a", "text": "y", "timestamp": 2.0, "embedding": [0, 1]},
    ])
    with pytest.raises(ValueError, match="duplicate id 'a'"):
        read_store(path)
    ppath = tmp_path / "dup.parquet"
    pq.write_table(pa.table({"id": ["a", "a"], "text": ["x", "y"], "timestamp": [1.0, 2.0],
                             "embedding": [[1.0, 0.0], [0.0, 1.0]]}), ppath)
    with pytest.raises(ValueError, match="duplicate id 'a'"):
        read_store(ppath)


def test_nan_embedding(tmp_path):
    path = tmp_path / "nan.jsonl"
    write_jsonl(path, [
        {"id": "a", "text": "x", "timestamp": 1.0, "embedding": [1, 0]},
        '{"id": "b", "text": "y", "timestamp": 2.0, "embedding": [NaN, 1]}',
    ])
    with pytest.raises(ValueError, match=r"node 'b' must be finite"):
        read_store(path)
    ppath = tmp_path / "nan.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["x", "y"], "timestamp": [1.0, 2.0],
                             "embedding": [[1.0, 0.0], [float("nan"), 1.0]]}), ppath)
    with pytest.raises(ValueError, match=r"node 'b' must be finite"):
        read_store(ppath)


def test_mixed_dims_jsonl(tmp_path):
    path = tmp_path / "mixed.jsonl"
    write_jsonl(path, [
        {"id": "a", "text": "x", "timestamp": 1.0, "embedding": [1, 0]},
        {"id": "b", "text": "y", "timestamp": 2.0, "embedding": [0, 1, 0]},
    ])
    with pytest.raises(ValueError, match=r"same dimension.*'b' has 3"):
        read_store(path)


def test_mixed_dims_and_nulls_parquet(tmp_path):
    path = tmp_path / "mixed.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c"], "text": ["x", "y", "z"], "timestamp": [1.0, 2.0, 3.0],
                             "embedding": [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0, 1.0]]}), path)
    with pytest.raises(ValueError, match=r"same dimension.*'c' has 3"):
        read_store(path)
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["x", "y"], "timestamp": [1.0, 2.0],
                             "embedding": [[1.0, 0.0], None]}), path)
    with pytest.raises(ValueError, match=r"embedding of node 'b' is missing"):
        read_store(path)
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["x", "y"], "timestamp": [1.0, 2.0],
                             "embedding": [[1.0, 0.0], [None, 1.0]]}), path)
    with pytest.raises(ValueError, match=r"embedding of node 'b' contains a null"):
        read_store(path)


def test_partial_embeddings_jsonl(tmp_path):
    path = tmp_path / "partial.jsonl"
    write_jsonl(path, [
        {"id": "a", "text": "x", "timestamp": 1.0, "embedding": [1, 0]},
        {"id": "b", "text": "y", "timestamp": 2.0},
    ])
    with pytest.raises(ValueError, match=r"embedding of node 'b' is missing"):
        read_store(path)


def test_missing_file(tmp_path):
    path = tmp_path / "nope.parquet"
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        read_store(path)


# ------------------------------------------------------------------ atomic writes
@pytest.mark.parametrize("fmt", FORMATS)
def test_atomic_write_failure_keeps_old_file(tmp_path, monkeypatch, fmt):
    path = tmp_path / f"store.{fmt}"
    old = make_store(n=3, seed=1)
    write_store(old, path)
    before = path.read_bytes()

    if fmt == "parquet":
        real = pq.ParquetWriter.write_table

        def boom(self, table, **kw):
            real(self, table.slice(0, 1), **kw)  # part of the data reaches the temp file
            raise OSError("disk full (simulated)")

        monkeypatch.setattr(pq.ParquetWriter, "write_table", boom)
    else:
        import memforest_gpu.store.jsonl as jsonl_mod

        real_dumps = jsonl_mod._dumps
        calls = {"n": 0}

        def boom(v, what, node_id):
            calls["n"] += 1
            if calls["n"] > 2:
                raise OSError("disk full (simulated)")
            return real_dumps(v, what, node_id)

        monkeypatch.setattr(jsonl_mod, "_dumps", boom)

    with pytest.raises(OSError, match="disk full"):
        write_store(make_store(n=6, seed=2), path)
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == [path.name]
    monkeypatch.undo()
    assert_same(old, read_store(path))


def test_write_creates_parents_and_replaces(tmp_path):
    path = tmp_path / "a" / "b" / "store.parquet"
    write_store(make_store(n=3, seed=1), path)
    new = make_store(n=4, seed=2)
    write_store(new, path)
    assert_same(new, read_store(path))
    assert os.listdir(path.parent) == ["store.parquet"]


def test_unserialisable_metadata_is_value_error(tmp_path):
    # metadata is kept as JSON text (columnar store), so a value that cannot be written is
    # refused when the store is built, naming the node, and nothing reaches the disk
    s = make_store(n=2)
    with pytest.raises(ValueError, match="metadata of node 'm0' cannot be written as JSON"):
        MemoryStore.from_columns(ids=s.ids, texts=s.texts, timestamps=s.timestamps, embeddings=s.embeddings,
                                 metadata=[{"bad": object()}, {}])
    with pytest.raises(ValueError, match="metadata of node 'm0'"):
        MemoryStore(s.ids, s.texts, s.embeddings, s.timestamps, s.tenants, s.sources, [{"bad": object()}, {}])
    assert os.listdir(tmp_path) == []
