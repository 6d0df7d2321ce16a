"""The on-disk embedding cache."""
from __future__ import annotations

import os

import torch
from eval_fixtures import BagOfWordsEmbedder

from memforest_gpu.evaluation import cache as cache_mod
from memforest_gpu.evaluation.cache import CachedEmbedder


def test_cache_round_trip_and_concurrent_writers(tmp_path):
    a_inner, b_inner = BagOfWordsEmbedder(), BagOfWordsEmbedder()
    a = CachedEmbedder(a_inner, tmp_path)
    b = CachedEmbedder(b_inner, tmp_path)  # a second run sharing the folder
    ea = a.embed(["one cat", "two dogs", "one cat"])
    eb = b.embed(["three birds", "two dogs"])
    assert ea.shape == (3, 64) and a_inner.calls == 2 and a.misses == 2 and a.hits == 1
    torch.testing.assert_close(ea[1], eb[1])
    assert a.flush() == 2 and b.flush() == 2 and a.flush() == 0
    parts = os.listdir(tmp_path / "bag-of-words-64")
    assert len(parts) == 2 and all(p.startswith("part-") for p in parts)
    c_inner = BagOfWordsEmbedder()
    c = CachedEmbedder(c_inner, tmp_path)
    ec = c.embed(["three birds", "one cat", "two dogs"])
    assert c_inner.calls == 0
    torch.testing.assert_close(ec, torch.stack([eb[0], ea[0], ea[1]]))
    assert c.count_tokens(["a b c", "x"]) == [3, 1]


def test_compaction_and_torn_parts(tmp_path, monkeypatch):
    monkeypatch.setattr(cache_mod, "_COMPACT_AT", 3)
    for i in range(4):
        e = CachedEmbedder(BagOfWordsEmbedder(), tmp_path)
        e.embed([f"text {i}"])
        e.flush()
    folder = tmp_path / "bag-of-words-64"
    (folder / "part-torn.npz").write_bytes(b"not a zip")  # a half-written part from elsewhere
    inner = BagOfWordsEmbedder()
    e = CachedEmbedder(inner, folder.parent)
    assert len(os.listdir(folder)) == 1  # four parts (and the torn one) compacted into one
    e.embed([f"text {i}" for i in range(4)])
    assert inner.calls == 0


def test_no_directory_means_memory_only(tmp_path):
    inner = BagOfWordsEmbedder()
    e = CachedEmbedder(inner, None)
    e.embed(["x y"])
    e.embed(["x y"])
    assert inner.calls == 1 and e.flush() == 0
