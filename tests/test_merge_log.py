"""The run's merges as columns (engine/output.py) and merged rows' sources made from their
parents (engine/node_table.py ``leaf_rows``, ``sources_arrow``, ``add_many``): the same records,
sources and ids as the per-merge Python objects they replace."""
from __future__ import annotations

import gc
import pickle
import weakref

import numpy as np
import pytest
import torch

from memforest_gpu import CompressConfig, MergeConfig, compress
from memforest_gpu.engine.node_table import NodeTable, merged_id
from memforest_gpu.engine.output import MergeLog, MergeRecord
from memforest_gpu.store.memory_store import MemoryStore
from memforest_gpu.store.synthetic import synthetic_store


def _store(rng, n: int) -> MemoryStore:
    """Originals with one to three sources each (an input that was compressed before)."""
    sources = [[f"s{i}.{k}" for k in range(int(rng.integers(1, 4)))] for i in range(n)]
    return MemoryStore.from_columns(ids=[f"m{i}" for i in range(n)], texts=[f"t{i}" for i in range(n)],
                                    sources=sources, timestamps=rng.integers(0, 5, n).astype(float),
                                    embeddings=torch.randn(n, 4), tenants=[f"u{i % 2}" for i in range(n)])


def test_sources_and_ids_from_parents_equal_the_per_merge_lists():
    """Random merge orders, some rounds of several pairs at once (``add_many``), merges of merges
    many levels deep: every row's sources equal the older parent's then the newer's, recursively,
    its id ``merged_id`` of them, and one pair at a time (``add``) makes the same table."""
    rng = np.random.default_rng(0)
    for _ in range(30):
        n = int(rng.integers(2, 30))
        st = _store(rng, n)
        t, one = NodeTable(st), NodeTable(st)
        want = {i: list(st.sources[i]) for i in range(n)}
        live = list(range(n))
        while len(live) > 1 and rng.random() < 0.9:
            k = int(rng.integers(1, len(live) // 2 + 1))  # k disjoint pairs in one batch
            pick = rng.choice(len(live), 2 * k, replace=False)
            older, newer = t.order_many(np.array([live[p] for p in pick[:k]]), np.array([live[p] for p in pick[k:]]))
            rows = t.add_many(older, newer, [f"x{len(t) + j}" for j in range(k)])
            assert [one.add(int(a), int(b), f"x{r}") for a, b, r in zip(older, newer, rows)] == rows.tolist()
            for a, b, r in zip(older.tolist(), newer.tolist(), rows.tolist()):
                want[r] = want[a] + want[b]
            live = [x for x in live if x not in set(older.tolist()) | set(newer.tolist())] + rows.tolist()
        every = np.arange(len(t))
        assert t.sources_arrow(every).to_pylist() == [want[r] for r in range(len(t))]
        assert t.sources_arrow(every[::-1].copy()).to_pylist() == [want[r] for r in range(len(t))][::-1]
        assert t.m_ids == one.m_ids == [merged_id(want[r]) for r in range(n, len(t))]
        assert t.sources_arrow(np.zeros(0, dtype=np.int64)).to_pylist() == []


def test_add_many_refuses_uneven_columns_and_rows_not_in_the_table():
    t = NodeTable(synthetic_store(6, dim=4, seed=1))
    with pytest.raises(ValueError, match="as many newer rows and texts as older rows"):
        t.add_many(np.array([0, 1]), np.array([2]), ["a", "b"])
    with pytest.raises(ValueError, match=r"rows already in the table \(< 6\), got row 6"):
        t.add_many(np.array([0]), np.array([6]), ["a"])
    assert len(t) == 6 and t.m_ids == [] and t.m_texts == []


def _old_records(t: NodeTable, log: MergeLog) -> list[MergeRecord]:
    """The records as the engine made them before the log: a Python object per merge."""
    return [MergeRecord(int(r), t.tenant_of(np.array([a]))[0], t.id_of(int(a)), t.id_of(int(b)), float(w),
                        t.id_of(int(j)), t.texts[int(j)])
            for r, a, b, j, w in zip(log.round, log.older, log.newer, log.into, log.similarity)]


def test_a_log_reads_the_records_a_list_held():
    st = synthetic_store(9000, tenants=3, dim=8, seed=2)  # more merges than one read block
    t = NodeTable(st)
    rows = t.add_many(np.arange(0, 8000, 2), np.arange(1, 8000, 2), [f"x{i}" for i in range(4000)])
    a = MergeLog.of_round(t, 1, np.arange(0, 8000, 2), np.arange(1, 8000, 2), rows, np.linspace(0, 1, 4000))
    rows2 = t.add_many(rows[:10], rows[10:20], [f"y{i}" for i in range(10)])
    b = MergeLog.of_round(t, 2, rows[:10], rows[10:20], rows2, np.full(10, 0.5))
    log = MergeLog.concat(t, [a, b])
    want = _old_records(t, log)
    assert len(log) == 4010 and list(log) == want and log == want and want == list(log)
    assert log[0] == want[0] and log[-1] == want[-1] and log[4005] == want[4005]
    assert list(log[3990:4002]) == want[3990:4002] and log[-3:] == want[-3:]
    assert want[-1].text == "y9" and want[-1].round == 2 and want[0].a == st.ids[0] and want[0].b == st.ids[1]
    back = pickle.loads(pickle.dumps(log))
    assert type(back) is list and back == want
    with pytest.raises(IndexError):
        log[4010]


def test_a_kept_log_does_not_keep_the_run_or_its_input():
    st = synthetic_store(40, tenants=2, dim=8, seed=3)
    t = NodeTable(st)
    rows = t.add_many(np.array([0, 2]), np.array([1, 3]), ["a", "b"])
    log = MergeLog.of_round(t, 1, np.array([0, 2]), np.array([1, 3]), rows, np.array([0.9, 0.8]))
    want = list(log)
    gone_table, gone_vectors = weakref.ref(t), weakref.ref(st.embeddings)
    del t, st
    gc.collect()
    assert gone_table() is None and gone_vectors() is None
    assert list(log) == want


def test_a_runs_merges_are_a_log_whose_records_match_the_output():
    st = synthetic_store(300, tenants=2, dim=16, seed=4)
    seen = []
    res = compress(st, CompressConfig(merge=MergeConfig(ratio=0.5, schedule="matching")),
                   on_round=lambda r, m: seen.append((r, list(m))))
    assert isinstance(res.merges, MergeLog) and len(res.merges) == res.report.merges == 150
    assert [m for _, ms in seen for m in ms] == list(res.merges)
    assert [r for r, ms in seen for _ in ms] == [m.round for m in res.merges]
    made = {m.into: m for m in res.merges}
    out = dict(zip(res.store.ids, res.store.texts))
    for i, src in zip(res.store.ids, res.store.sources):
        if i in made:  # a merged output node: its record's text and id, its sources its inputs'
            assert made[i].text == out[i] and i == merged_id(list(src))
    assert sorted(s for src in res.store.sources for s in src) == sorted(st.ids)
