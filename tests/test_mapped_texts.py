"""Texts read into a mapped spill file (memforest_gpu.store.mapped_texts): the same values as a
plain read, the same errors, the same runs, and pages handed back at release_free_heap."""
from __future__ import annotations

import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from memforest_gpu import CompressConfig, MergeConfig, compress
from memforest_gpu.heap import _MAPPINGS, release_free_heap
from memforest_gpu.store import mapped_texts
from memforest_gpu.store.io import read_store, write_store
from memforest_gpu.store.parquet import read_parquet_columns
from memforest_gpu.store.synthetic import synthetic_store


def _texts_file(path, n=20_000, *, large=False, nulls=()):
    rng = np.random.default_rng(0)
    texts = [f"t{i} " + "é" * int(rng.integers(0, 20)) + "x" * int(rng.integers(0, 200)) for i in range(n)]
    for j in nulls:
        texts[j] = None
    t = pa.large_string() if large else pa.string()
    pq.write_table(pa.table({
        "id": [f"n{i}" for i in range(n)],
        "text": pa.array(texts, type=t),
        "timestamp": np.arange(n, dtype=np.float64) + 1.7e9,
        "tenant": ["a" if i % 3 else "b" for i in range(n)],
    }), path, row_group_size=5_000)
    return texts


@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("tenants", [None, "a"])
def test_mapped_texts_equal_the_plain_read(tmp_path, large, tenants):
    path = tmp_path / "s.parquet"
    _texts_file(path, large=large, nulls=(5, 19_999))  # several batches and row groups, nulls in two
    plain, _ = read_parquet_columns(str(path), tenants, mapped_texts=-1)
    mapped, _ = read_parquet_columns(str(path), tenants, mapped_texts=0)
    want = plain["text"].cast(pa.large_string())
    got = mapped["text"]
    got.validate(full=True)
    assert got.type == pa.large_string() and got.equals(want) and got.null_count == want.null_count
    assert any(len(mm) == got.buffers()[2].size for mm in _MAPPINGS)  # its characters are a mapped file
    assert read_parquet_columns(str(path), tenants, mapped_texts=1 << 40)[0]["text"].equals(plain["text"])


def test_mapped_store_reads_and_compresses_as_the_plain_one(tmp_path, monkeypatch):
    path = str(tmp_path / "s.parquet")
    write_store(synthetic_store(600, dim=16, seed=3, tenants=2), path)
    cfg = CompressConfig(merge=MergeConfig(ratio=0.5, schedule="matching"))
    runs = []
    for threshold in ("-1", "0"):
        monkeypatch.setenv("MEMFOREST_MAPPED_TEXTS", threshold)
        store = read_store(path)
        res = compress(store, cfg)
        runs.append((list(store.texts), list(res.store.ids), list(res.store.texts), list(res.store.sources)))
        out = res.store.texts.arrow
        assert any(len(mm) == out.buffers()[2].size for mm in _MAPPINGS) == (threshold == "0")  # output mapped too
        out.validate(full=True)
    assert runs[0] == runs[1]


def test_empty_and_null_texts_raise_as_before(tmp_path, monkeypatch):
    path = tmp_path / "s.parquet"
    _texts_file(path, n=300, nulls=(7,))
    errors = []
    for threshold in ("-1", "0"):
        monkeypatch.setenv("MEMFOREST_MAPPED_TEXTS", threshold)
        with pytest.raises(ValueError, match="text of node 'n7' must be a non-empty string") as e:
            read_store(str(path))
        errors.append(str(e.value))
    assert errors[0] == errors[1]


def test_threshold_from_the_environment(tmp_path, monkeypatch):
    path = tmp_path / "s.parquet"
    _texts_file(path, n=300)
    pf = pq.ParquetFile(path)
    monkeypatch.setenv("MEMFOREST_MAPPED_TEXTS", "lots")
    with pytest.raises(ValueError, match="MEMFOREST_MAPPED_TEXTS must be a whole number of bytes.*'lots'"):
        mapped_texts.text_spill(pf)
    monkeypatch.setenv("MEMFOREST_MAPPED_TEXTS", "-1")
    assert mapped_texts.text_spill(pf) is None
    monkeypatch.setenv("MEMFOREST_MAPPED_TEXTS", "0")
    assert mapped_texts.text_spill(pf) is not None
    monkeypatch.delenv("MEMFOREST_MAPPED_TEXTS")
    assert mapped_texts.text_spill(pf) is None  # 300 short texts: under the default
    assert mapped_texts.text_spill(pf, 0) is not None


def _rss_file_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssFile:"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_pages_read_are_handed_back(tmp_path):
    path = tmp_path / "s.parquet"
    n = 40_000
    pq.write_table(pa.table({"id": [str(i) for i in range(n)], "text": ["y" * 1_000 + str(i) for i in range(n)],
                             "timestamp": np.zeros(n)}), path)
    texts = read_parquet_columns(str(path), mapped_texts=0)[0]["text"]
    release_free_heap()
    before = _rss_file_kb()
    assert pc.sum(pc.match_substring(texts, "q")).as_py() == 0  # reads every character
    touched = _rss_file_kb()
    release_free_heap()
    after = _rss_file_kb()
    assert touched - before > 30_000  # ~40 MB of characters paged in
    assert touched - after > 30_000  # and handed back
    assert texts[n - 1].as_py() == "y" * 1_000 + str(n - 1)  # read again from the page cache


def test_a_spill_that_cannot_be_written_says_why_and_what_to_do(tmp_path, monkeypatch):
    path = tmp_path / "s.parquet"
    _texts_file(path, n=300)

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(mapped_texts.tempfile, "TemporaryFile", full)
    monkeypatch.setenv("MEMFOREST_MAPPED_TEXTS", "0")
    with pytest.raises(mapped_texts.SpillError, match="cannot write the texts' spill file in .*No space left.*"
                                                      "set TMPDIR.*MEMFOREST_MAPPED_TEXTS=-1"):
        read_store(str(path))
    monkeypatch.setenv("MEMFOREST_MAPPED_TEXTS", "-1")  # the way out it names
    assert len(read_parquet_columns(str(path))[0]["text"]) == 300


def test_a_bad_bound_is_refused_before_any_round(monkeypatch):
    store = synthetic_store(300, dim=16, seed=4)  # in memory: the bound is first read by the run
    rounds = []
    monkeypatch.setenv("MEMFOREST_MAPPED_TEXTS", "16M")
    with pytest.raises(ValueError, match="MEMFOREST_MAPPED_TEXTS must be a whole number of bytes.*'16M'"):
        compress(store, CompressConfig(merge=MergeConfig(ratio=0.5)), on_round=lambda r, m: rounds.append(r))
    assert rounds == []
