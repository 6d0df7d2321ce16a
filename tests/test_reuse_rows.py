"""A run allowed to overwrite its input's vectors (``MemoryPlan(overwrite_input=True)``, every file run) keeps
each merged vector in a dead row of the input itself (its earliest original's), so the run holds
no second vector table; its output equals the copying run's in every column, keys included."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import memforest_gpu.engine.compression as engine_setup
import memforest_gpu.store.merged_keys as merged_keys
from memforest_gpu import compress
from memforest_gpu.config import PRESETS
from memforest_gpu.engine.memory import MemoryPlan
from memforest_gpu.store.synthetic import synthetic_store


def _run(cfg, copy: bool):
    st = synthetic_store(2400, dim=24, tenants=3, seed=4)
    res = compress(st, cfg, memory=MemoryPlan(overwrite_input=not copy))
    return st, res


@pytest.mark.parametrize("preset,keys", [("memforest", -1), ("memforest", 0), ("paper", None)])
def test_reusing_rows_gives_the_copying_runs_output(monkeypatch, preset, keys):
    cfg = PRESETS[preset]
    if keys is not None:
        cfg = dataclasses.replace(cfg, merge=dataclasses.replace(cfg.merge, keys=keys))
    seen = []
    build = engine_setup.build_trees

    def spy(*a, **k):
        batch = build(*a, **k)
        seen.append(batch.vectors)
        return batch

    monkeypatch.setattr(engine_setup, "build_trees", spy)
    took, real_put = [], merged_keys._put_saved

    def put(vec, origin, saved):
        took.append(len(saved))
        return real_put(vec, origin, saved)

    monkeypatch.setattr(merged_keys, "_put_saved", put)
    _, a = _run(cfg, True)
    st, b = _run(cfg, False)
    assert [v.reuse for v in seen] == [False, True]
    assert seen[1]._extra.shape[0] == 1  # no table of merged vectors beside the input's
    assert b.store.embeddings.data_ptr() == st.embeddings.data_ptr()  # the output is the input's rows
    assert torch.equal(a.store.embeddings, b.store.embeddings)
    assert a.store.ids == b.store.ids and a.store.texts == b.store.texts and a.store.sources == b.store.sources
    assert [m.to_dict() for m in a.merges] == [m.to_dict() for m in b.merges]
    if cfg.merge.keys != 0:
        assert took[-1] > 0  # input rows overwritten: their codes kept first
        assert not seen[1].saved  # and taken out of the run's list as the keys read them (held once)
        ka, kb = a.store.keys, b.store.keys
        assert torch.equal(ka.vectors, kb.vectors) and np.array_equal(ka.counts, kb.counts)
        assert ka.sources.equals(kb.sources)
    else:
        assert a.store.keys is None and b.store.keys is None
    ea, eb = a.store.event_trees, b.store.event_trees
    assert np.array_equal(ea.tree, eb.tree) and ea.tenants.keys() == eb.tenants.keys()
    for t in ea.tenants:
        assert repr(ea.tenants[t]) == repr(eb.tenants[t])


def test_bounded_or_float_keys_keep_the_merged_table(monkeypatch):
    """Keys made from float vectors (bounded keys, float32 codes) need the input's vectors at the
    end: such a run keeps its merged vectors in their own table."""
    cfg = PRESETS["memforest"]
    seen = []
    build = engine_setup.build_trees
    monkeypatch.setattr(engine_setup, "build_trees", lambda *a, **k: seen.append(build(*a, **k)) or seen[-1])
    for merge in (dataclasses.replace(cfg.merge, keys=2), dataclasses.replace(cfg.merge, vectors="float32")):
        compress(synthetic_store(600, dim=8, tenants=2, seed=1), dataclasses.replace(cfg, merge=merge),
                 memory=MemoryPlan(overwrite_input=True))
    assert [b.vectors.reuse for b in seen] == [False, False]
