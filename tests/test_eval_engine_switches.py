"""Engine switches added for the quality work: local time on the tree's edges, and a cap
that removes edges from the tree instead of blocking it."""
from __future__ import annotations

from collections import Counter

import pytest
import torch
from paper import paper_config, paper_merge, paper_partition, paper_spanning

from memforest_gpu.config import CompressConfig, MergeConfig, PartitionConfig, SpanningConfig
from memforest_gpu.engine import compress
from memforest_gpu.engine.quotas import removal_target
from memforest_gpu.store.memory_store import MemoryStore
from memforest_gpu.store.synthetic import synthetic_store


def test_time_weight_is_validated():
    assert SpanningConfig().time_weight == 0.5 and paper_spanning().time_weight == 0.0
    assert SpanningConfig().time_window == 1
    with pytest.raises(ValueError, match=r"time_weight must be in \[0.0, 1.0\], got 1.5"):
        paper_spanning(time_weight=1.5)
    with pytest.raises(ValueError, match="time_window must be an integer >= 1"):
        paper_spanning(time_window=0)


def _two_topics(n=8, dim=8):
    """Turns alternate between two topics (even: topic A, odd: topic B), a little noise."""
    g = torch.Generator().manual_seed(0)
    X = torch.zeros(n, dim)
    X[0::2, 0] = 1.0
    X[1::2, 1] = 1.0
    X = X + 0.05 * torch.rand(n, dim, generator=g)
    ts = [1.6e9 + 60 * i for i in range(n)][::-1]  # rows in reverse time order: positions are by time
    return MemoryStore.from_columns(ids=[f"n{i}" for i in range(n)][::-1], texts=[f"turn {i}." for i in range(n)][::-1],
                                    timestamps=ts, embeddings=X.flip(0))


def _cfg(time_weight, ratio=0.5, schedule="sequential", time_rule="gated"):
    return paper_config(partition=paper_partition(alpha=0.01),
                          spanning=paper_spanning(eta=1.0, time_weight=time_weight, time_window=1, time_rule=time_rule),
                          merge=paper_merge(ratio=ratio, schedule=schedule))


def _groups(res):
    return sorted(sorted(int(x[1:]) for x in s) for s in res.store.sources)


@pytest.mark.parametrize("schedule", ["sequential", "matching"])
def test_time_weight_merges_neighbours(schedule):
    st = _two_topics()
    by_topic = _groups(compress(st, _cfg(0.0, schedule=schedule), device="cpu"))
    assert all(len({i % 2 for i in g}) == 1 for g in by_topic)  # cosine only: same topic, far apart in time
    by_time = _groups(compress(st, _cfg(0.6, schedule=schedule, time_rule="flat"), device="cpu"))
    # the flat 0/1 bonus for neighbouring positions outweighs the topic: every merge joins neighbours in time
    assert all(g == list(range(g[0], g[0] + len(g))) for g in by_time), by_time
    # the gated rule (the default) gives no bonus to neighbours of cosine ~0: merges follow the topic
    gated = _groups(compress(st, _cfg(0.6, schedule=schedule), device="cpu"))
    assert all(len({i % 2 for i in g}) == 1 for g in gated), gated


def test_time_weight_zero_is_the_paper():
    """With the time term off, the engine makes the paper's merges: held against the
    independent plain-Python reference of the method's merge order, merge for merge."""
    from test_merge_order import compare

    from memforest_gpu.mergers.extractive import ExtractiveMerger

    compare(_two_topics(), _cfg(0.0), ExtractiveMerger)


def test_cap_removes_edges_instead_of_blocking_the_tree():
    """One tree: a long node is every short node's nearest neighbour (a star), but no merge
    with it fits the cap. Short nodes still merge with each other."""
    dim = 8
    hub = torch.zeros(dim)
    hub[0] = 1.0
    rows, texts = [hub], ["word " * 30]
    for i in range(6):
        v = torch.zeros(dim)
        v[0], v[1 + i] = 1.0, 0.8  # close to the hub, less close to each other
        rows.append(v)
        texts.append(f"short note {i}.")
    st = MemoryStore.from_columns(ids=[f"n{i}" for i in range(7)], texts=texts,
                                  timestamps=[1.6e9 + i for i in range(7)], embeddings=torch.stack(rows))
    cfg = paper_config(partition=paper_partition(alpha=0.01),
                         merge=paper_merge(ratio=0.4, max_node_tokens=20, cap_policy="strict"))  # "condense" merges it
    res = compress(st, cfg, device="cpu")
    assert res.report.shortfall == 0 and len(res.store) == 7 - removal_target(7, 0.4)
    assert "n0" in res.store.ids  # the long node is never merged
    assert all(len(s) == 1 or "n0" not in s for s in res.store.sources)


@pytest.mark.parametrize("schedule", ["sequential", "matching"])
def test_time_weight_keeps_the_engine_invariants(schedule):
    st = synthetic_store(120, tenants=3, dim=16, seed=4)
    cfg = paper_config(spanning=paper_spanning(time_weight=0.3, time_window=2),
                         merge=paper_merge(ratio=0.6, schedule=schedule))
    res = compress(st, cfg, device="cpu")
    n_in, n_out = Counter(st.tenants), Counter(res.store.tenants)
    for t, n in n_in.items():
        assert n - n_out[t] == removal_target(n, 0.6)
    assert sorted(x for s in res.store.sources for x in s) == sorted(st.ids)


# ---------------------------------------------------------------- size on the edges
def test_size_weight_is_validated():
    assert paper_spanning().size_weight == 0.0
    with pytest.raises(ValueError, match=r"size_weight must be in \[0.0, 1.0\], got -0.1"):
        paper_spanning(size_weight=-0.1)
    with pytest.raises(ValueError, match="size_weight must be a finite number"):
        paper_spanning(size_weight=float("nan"))


def _long_and_short():
    """Two long nodes that are the most similar pair, two short ones a little less similar."""
    X = torch.zeros(4, 8)
    X[0, 0] = 1.0
    X[1, 0], X[1, 1] = 1.0, 0.3  # cos(n0, n1) ~ 0.96
    X[2, 2] = 1.0
    X[3, 2], X[3, 3] = 1.0, 0.5  # cos(n2, n3) ~ 0.89
    texts = ["long " * 100 + "a.", "long " * 100 + "b.", "short c.", "short d."]
    return MemoryStore.from_columns(ids=[f"n{i}" for i in range(4)], texts=texts,
                                    timestamps=[1.6e9 + i for i in range(4)], embeddings=X)


@pytest.mark.parametrize("schedule", ["sequential", "matching"])
def test_size_weight_merges_short_nodes_first(schedule):
    st = _long_and_short()

    def cfg(sw):
        return paper_config(partition=paper_partition(alpha=0.01), spanning=paper_spanning(eta=1.0, size_weight=sw),
                              merge=paper_merge(ratio=0.25, schedule=schedule))

    plain = compress(st, cfg(0.0), device="cpu")
    assert _groups(plain) == [[0, 1], [2], [3]]  # cosine only: the two long nodes
    sized = compress(st, cfg(0.5), device="cpu")
    # 0.96 - 0.5 * 202/256 < 0.89 - 0.5 * 4/256: the short pair goes first
    assert _groups(sized) == [[0], [1], [2, 3]]
    assert sized.merges[0].similarity == pytest.approx(float(st.embeddings[2] @ st.embeddings[3]), abs=1e-6)


def test_size_weight_is_measured_in_size_unit_not_the_cap():
    """The same lengths weigh more under a smaller unit; the node cap never changes the term."""
    st = _long_and_short()

    def cfg(unit, cap):
        return paper_config(partition=paper_partition(alpha=0.01),
                              spanning=paper_spanning(eta=1.0, size_weight=0.2, size_unit=unit),
                              merge=paper_merge(ratio=0.25, max_node_tokens=cap))

    # 0.96 - 0.2 * 202/10000 > 0.89 - 0.2 * 4/10000: the long pair still wins under a large unit ...
    assert _groups(compress(st, cfg(10000, 10000), device="cpu")) == [[0, 1], [2], [3]]
    # ... and loses under a unit close to its merged length: 0.96 - 0.2 * 202/250 < 0.89 - 0.2 * 4/250
    assert _groups(compress(st, cfg(250, 10000), device="cpu")) == [[0], [1], [2, 3]]
    # the cap is not the unit: a tight cap that still admits both pairs leaves the choice alone
    assert _groups(compress(st, cfg(10000, 250), device="cpu")) == [[0, 1], [2], [3]]


def test_size_weight_zero_is_the_paper():
    """With the size term off, the engine makes the paper's merges (the independent
    reference, merge for merge), and with it on, on the same store, it does not."""
    from test_merge_order import compare

    from memforest_gpu.mergers.extractive import ExtractiveMerger

    st = synthetic_store(90, tenants=2, dim=16, seed=1)
    compare(st, paper_config(spanning=paper_spanning(size_weight=0.0)), ExtractiveMerger)
    on = compress(st, paper_config(spanning=paper_spanning(size_weight=0.5)), device="cpu")
    off = compress(st, paper_config(spanning=paper_spanning(size_weight=0.0)), device="cpu")
    assert [(m.a, m.b) for m in on.merges] != [(m.a, m.b) for m in off.merges]


@pytest.mark.parametrize("schedule", ["sequential", "matching"])
@pytest.mark.parametrize("cap", [None, 40])
def test_size_weight_keeps_the_engine_invariants(schedule, cap):
    """Without a cap the lengths are tracked through merges all the same (progressive merging)."""
    st = synthetic_store(120, tenants=3, dim=16, seed=4)
    cfg = paper_config(spanning=paper_spanning(time_weight=0.3, size_weight=0.4),
                         merge=paper_merge(ratio=0.6, schedule=schedule, max_node_tokens=cap))
    res = compress(st, cfg, device="cpu")
    n_in, n_out = Counter(st.tenants), Counter(res.store.tenants)
    for t, n in n_in.items():
        assert n - n_out[t] + next(r["shortfall"] for r in res.report.tenants if r["tenant"] == t) == \
            removal_target(n, 0.6)
    assert sorted(x for s in res.store.sources for x in s) == sorted(st.ids)
    if cap is None:
        assert res.report.shortfall == 0
