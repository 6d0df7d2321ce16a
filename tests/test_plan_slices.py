"""Scoring a bucket of big trees in slices (engine.plan.DENSE_EDGE_BLOCK) bounds the temporaries
without changing a single plan."""
import pytest
import torch

import memforest_gpu.engine.plan as plan_dense
from memforest_gpu import compress
from memforest_gpu.config import preset
from memforest_gpu.store.synthetic import synthetic_store


@pytest.mark.parametrize("name", ["memforest", "paper"])
def test_sliced_scoring_gives_the_same_merges(monkeypatch, name):
    store = synthetic_store(1500, tenants=4, dim=16, seed=5)
    cfg = preset(name)
    whole = compress(store, cfg)
    monkeypatch.setattr(plan_dense, "DENSE_EDGE_BLOCK", {"cpu": 64, "cuda": 64})  # one tree per slice
    sliced = compress(store, cfg)
    assert list(sliced.store.ids) == list(whole.store.ids)
    assert torch.equal(sliced.store.embeddings, whole.store.embeddings)
    assert [(m.round, m.a, m.b, m.similarity) for m in sliced.merges] == \
        [(m.round, m.a, m.b, m.similarity) for m in whole.merges]
