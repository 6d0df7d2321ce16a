"""The drift bound of one-vector stores (engine/edges.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from memforest_gpu.config import CompressConfig, MergeConfig, SpanningConfig
from memforest_gpu.engine import compress
from memforest_gpu.engine.edges import merged_cosines
from memforest_gpu.store.memory_store import MemoryStore


def test_merged_cosines():
    c = torch.tensor([0.2, 0.7, 1.0], dtype=torch.float64)
    ca, cb = merged_cosines(c, None, None)  # equal weights: the bisector
    np.testing.assert_allclose(ca.numpy(), np.sqrt((1 + c.numpy()) / 2))
    np.testing.assert_allclose(cb.numpy(), ca.numpy())
    ca, cb = merged_cosines(torch.tensor([0.9], dtype=torch.float64), torch.tensor([100]), torch.tensor([5]))
    m = math.sqrt(100 ** 2 + 5 ** 2 + 2 * 100 * 5 * 0.9)
    assert ca.item() == pytest.approx((100 + 5 * 0.9) / m) and cb.item() == pytest.approx((5 + 100 * 0.9) / m)
    assert cb.item() < ca.item()  # the short memory is the one left behind


def _unit(*xs):
    v = torch.tensor(xs, dtype=torch.float32)
    return (v / v.norm()).tolist()


def _store():
    """A long memory A, two short ones B and C: cos(A, B) = 0.9, cos(B, C) = 0.7, cos(A, C) lower."""
    b = [1.0, 0.0, 0.0]
    a = [0.9, math.sqrt(1 - 0.81), 0.0]
    c = [0.7, -0.3, math.sqrt(1 - 0.49 - 0.09)]
    recs = [{"id": "A", "text": " ".join(["alpha"] * 100), "timestamp": 0.0, "embedding": _unit(*a)},
            {"id": "B", "text": "beta beta beta beta beta", "timestamp": 1000.0, "embedding": _unit(*b)},
            {"id": "C", "text": "gamma gamma gamma gamma gamma", "timestamp": 2000.0, "embedding": _unit(*c)}]
    return MemoryStore.from_records(recs)


@pytest.mark.parametrize("graph", ["dense", "knn"])
def test_the_bound_sends_a_drifting_pair_last(graph):
    def merged(bound):
        cfg = CompressConfig(spanning=SpanningConfig(size_weight=0.2, drift_min_cos=bound, graph=graph, knn_above=0),
                             merge=MergeConfig(ratio=0.34))
        out = compress(_store(), cfg).store
        return sorted(tuple(sorted(s)) for s in out.sources)
    assert merged(None) == [("A", "B"), ("C",)]
    assert merged(0.92) == [("A",), ("B", "C")]  # A+B leaves B at 0.909 < 0.92; B+C keeps both at 0.922


def test_every_pair_refused_changes_nothing_and_reaches_the_ratio():
    rng = np.random.default_rng(0)
    X = torch.nn.functional.normalize(torch.from_numpy(rng.normal(size=(40, 8)).astype(np.float32)), dim=1)
    recs = [{"id": f"n{i}", "text": "word " * (1 + i % 7), "timestamp": float(i), "embedding": X[i].tolist()}
            for i in range(40)]
    outs = []
    for bound in (None, 1.0):
        cfg = CompressConfig(spanning=SpanningConfig(size_weight=0.2, time_weight=0.5, drift_min_cos=bound),
                             merge=MergeConfig(ratio=0.5, schedule="matching"))
        res = compress(MemoryStore.from_records(recs), cfg)
        assert len(res.store) == 20
        outs.append([list(s) for s in res.store.sources])
    assert outs[0] == outs[1]  # a uniform shift of every weight keeps every choice


def test_length_last_merges_short_pairs_first_and_still_reaches_the_ratio():
    def merged(bound, ratio=0.34):
        cfg = CompressConfig(spanning=SpanningConfig(length_last=bound), merge=MergeConfig(ratio=ratio))
        return sorted(tuple(sorted(s)) for s in compress(_store(), cfg).store.sources)
    assert merged(None) == [("A", "B"), ("C",)]  # cosine 0.9 first
    assert merged(50) == [("A",), ("B", "C")]  # A + B would hold 105 words
    assert merged(50, ratio=0.67) == [("A", "B", "C")]  # the ratio is reached all the same
