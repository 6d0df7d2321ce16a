"""compact (engine/compaction/): budgets per tenant, local re-planning, the same guarantees
as compress across many compactions."""
from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest
import torch
from compact_helpers import arrivals, check_compaction, check_event_trees, origin_tenants, same_store, store_of

from memforest_gpu import compress
from memforest_gpu.config import CompactConfig, CompressConfig, PartitionConfig
from memforest_gpu.engine.compaction import compact
from memforest_gpu.engine.compaction.replan_quotas import compaction_quotas
from memforest_gpu.engine.placement import place_new, positions
from memforest_gpu.store.splice import append

compact_mod = importlib.import_module("memforest_gpu.engine.compaction.replan")  # the module that runs it

PAPER = CompressConfig.preset("paper")
BUDGET = CompactConfig(max_nodes={"a": 50, "b": 80, "c": 40, "d": 1000}, low_water=0.8)


def _sequence(steps: int, cfg=PAPER, budget=BUDGET):
    """Compactions with memories arriving between them; checks every one; returns the stores."""
    recs = arrivals(0, 60, ["a", "b", "c", "d"])
    owner = origin_tenants(recs)
    store = store_of(recs)
    out = []
    for k in range(steps):
        res = compact(store, budget, cfg, device="cpu")
        check_compaction(store, res, budget, owner)
        out.append(res)
        new = arrivals(k + 1, 10, ["a", "b", "c", "d"][: k % 4 + 1])
        owner.update(origin_tenants(new))
        store = append(res.store, store_of(new))
    return out


def test_twelve_compactions_keep_every_guarantee_and_are_deterministic():
    first = _sequence(12)
    assert sum(r.report.merges for r in first) > 100
    kinds = {(t["repartitioned"], t["placed"] > 0, t["new_trees"] > 0) for r in first for t in r.report.tenants}
    assert (False, True, False) in kinds or (False, True, True) in kinds  # new memories placed into old trees
    assert any(k[0] for k in kinds) and any(not k[0] for k in kinds)
    assert all(t["tenant"] != "d" for r in first for t in r.report.tenants)  # within budget: never compacted
    again = _sequence(12)
    for a, b in zip(first, again):
        assert same_store(a.store, b.store)


def test_within_budget_tenants_are_not_read(monkeypatch):
    seen = []
    real = compact_mod.compress

    def spy(store, *a, **kw):
        seen.append(set(store.tenants))
        return real(store, *a, **kw)

    monkeypatch.setattr(compact_mod, "compress", spy)
    store = store_of(arrivals(0, 60, ["a", "b", "c", "d"]))
    res = compact(store, BUDGET, PAPER, device="cpu")
    assert seen == [{"a", "c"}]  # b (60 <= 80) and d are neither partitioned nor planned
    assert {t["tenant"] for t in res.report.tenants} == {"a", "c"}
    nothing = compact(res.store, BUDGET, PAPER, device="cpu")
    assert nothing.store is res.store and not nothing.report.tenants and len(seen) == 1


def test_compress_output_is_compacted_in_its_own_trees():
    store = store_of(arrivals(0, 200, ["a"]))
    res = compress(store, PAPER, device="cpu")
    f = res.store.event_trees
    assert f.tenants["a"].n_trees == int(f.tree.max()) + 1 and f.tenants["a"].partitioned == 200
    check_event_trees(res.store, ["a"])
    # near-copies of 5 members of one tree, later in time: they fit that tree
    rows = np.flatnonzero(f.tree == 0)[:5]
    e = res.store.embeddings[torch.as_tensor(rows)] + 0.01 * torch.randn(5, res.store.dim,
                                                                         generator=torch.Generator().manual_seed(0))
    new = [{"id": f"new-{j}", "text": f"again {res.store.texts[int(r)]}", "timestamp": 2e9 + j, "tenant": "a",
            "embedding": e[j].tolist()} for j, r in enumerate(rows)]
    grown = append(res.store, store_of(new))
    budget = CompactConfig(max_nodes=len(res.store), low_water=1.0)
    out = compact(grown, budget, PAPER, device="cpu")
    t = out.report.tenants[0]
    assert not t["repartitioned"] and t["placed"] == 5 and t["new_trees"] == 0
    assert t["trees_replanned"] <= 3 < t["trees"]  # local: the tree that received them, and two of 10 small ones
    assert len(out.store) == len(res.store) and out.report.merges == 5


@pytest.mark.parametrize("change", ["no-state", "config", "growth", "forced"])
def test_full_repartition_when_warranted(change):
    store = compress(store_of(arrivals(0, 100, ["a"])), PAPER, device="cpu").store  # 50 nodes, trees recorded
    cfg, budget = PAPER, CompactConfig(max_nodes=50, low_water=0.8)
    n_new = 10
    if change == "no-state":
        store.event_trees = None
    elif change == "config":
        cfg = dataclasses.replace(PAPER, partition=PartitionConfig(alpha=0.1))
    elif change == "growth":
        n_new = 100  # as many as the tenant had when partitioned
    else:
        budget = dataclasses.replace(budget, repartition=True)
    grown = append(store, store_of(arrivals(1, n_new, ["a"])))
    res = compact(grown, budget, cfg, device="cpu")
    assert res.report.tenants[0]["repartitioned"]
    state = res.store.event_trees.tenants["a"]
    assert state.partitioned == 50 + n_new and state.arrived == 0
    assert res.store.event_trees.tenants["a"].config == dataclasses.asdict(cfg.partition)
    small = compact(append(store, store_of(arrivals(1, 10, ["a"]))), CompactConfig(max_nodes=50), PAPER,
                    device="cpu")
    if change in ("growth", "forced"):  # the others change what the state is; here it is intact
        assert not small.report.tenants[0]["repartitioned"]
        assert small.store.event_trees.tenants["a"].arrived == 10


def test_a_lost_centre_is_replaced():
    base = compress(store_of(arrivals(0, 120, ["a"])), PAPER, device="cpu").store
    f = base.event_trees
    gone = f.tenants["a"].centres[0]
    keep = [j for j, s in enumerate(base.sources) if gone not in s]  # deleted outside memforest
    store = append(base.take(keep), store_of(arrivals(1, 10, ["a"])))
    owner = {x: "a" for s in store.sources for x in s}
    res = compact(store, CompactConfig(max_nodes=50), PAPER, device="cpu")
    check_compaction(store, res, CompactConfig(max_nodes=50), owner)
    assert res.store.event_trees.tenants["a"].centres[0] != gone


def test_dry_run_plans_without_merging():
    store = store_of(arrivals(0, 60, ["a", "b"]))
    res = compact(store, CompactConfig(max_nodes=40), PAPER, device="cpu", dry_run=True)
    assert res.store is store and not res.merges
    assert [(t["tenant"], t["nodes_out"], t["removed"]) for t in res.report.tenants] == [("a", 32, 28), ("b", 32, 28)]


def test_exact_keep_and_low_water_one():
    store = store_of(arrivals(0, 57, ["a", "b"]))
    res = compact(store, CompactConfig(max_nodes=50, low_water=1.0), PAPER, device="cpu")
    assert [t["nodes_out"] for t in res.report.tenants] == [50, 50] and res.report.merges == 14
    res = compact(store, CompactConfig(max_nodes=50, low_water=0.31), PAPER, device="cpu")
    assert [t["nodes_out"] for t in res.report.tenants] == [15, 15]


def test_compaction_quotas_follow_the_excess():
    # tenant 0: trees of 10 originals, one received 6 new nodes (size 11, 16 originals); keep 22 of 27
    size = np.array([5, 5, 11, 4])
    orig = np.array([10, 10, 16, 10])
    tt = np.array([0, 0, 0, 1])
    per, remove, short = compaction_quotas(size, orig, tt, np.array([14, 1]))
    assert remove.tolist() == [7, 3] and short.tolist() == [0, 0]
    assert per[:3].sum() == 7 and per[2] == per[:3].max() and per[3] == 3
    per, remove, short = compaction_quotas(np.array([2, 2]), np.array([2, 2]), np.array([0, 0]), np.array([1]))
    assert per.tolist() == [1, 1] and short.tolist() == [1]  # a tree keeps one node


def test_placement_is_spec_rule():
    g = torch.Generator().manual_seed(1)
    N, D = 40, 8
    emb = torch.nn.functional.normalize(torch.randn(N, D, generator=g), dim=1)
    ts = torch.arange(N, dtype=torch.float64)
    codes = torch.tensor([0] * 25 + [1] * 15)
    tree = np.r_[np.arange(20) % 3, -np.ones(5, dtype=np.int64), np.arange(10) % 2, -np.ones(5, dtype=np.int64)]
    start = np.array([0, 3, 5])
    centre = torch.tensor([0, 1, 2, 25, 26])
    cfg = PartitionConfig(beta=0.8, window=5)
    p = place_new(emb, ts, codes, ["x", "y"], tree, start, centre, cfg)
    pos = positions(codes, ts)
    for i in np.flatnonzero(tree < 0).tolist():
        t0, k = int(codes[i]), int(start[int(codes[i])])
        cs = centre[k:start[t0 + 1]]
        members = [j for j in range(N) if int(codes[j]) == t0 and tree[j] >= 0]
        rad = [min(float(emb[j] @ emb[int(c)]) for j in members if tree[j] == q) for q, c in enumerate(cs.tolist())]
        cos = [float(emb[i] @ emb[int(c)]) for c in cs.tolist()]
        if any(x >= r - 1e-6 for x, r in zip(cos, rad)):
            u = [0.8 * x + 0.2 * (abs(int(pos[i]) - int(pos[int(c)])) <= 5) for x, c in zip(cos, cs.tolist())]
            assert p.tree[i] == int(np.argmax(u)), i
        else:
            assert p.tree[i] >= len(cs)  # a new tree of its own
    assert p.n_trees.tolist() == (np.diff(start) + p.new_trees).tolist()


def test_a_tree_left_empty_is_dropped():
    base = compress(store_of(arrivals(0, 120, ["a"])), PAPER, device="cpu").store
    k = base.event_trees.tenants["a"].n_trees
    store = append(base.take(np.flatnonzero(base.event_trees.tree != 1)), store_of(arrivals(1, 10, ["a"])))
    owner = {x: "a" for s in store.sources for x in s}
    res = compact(store, CompactConfig(max_nodes=50), PAPER, device="cpu")
    check_compaction(store, res, CompactConfig(max_nodes=50), owner)
    assert res.store.event_trees.tenants["a"].n_trees == k - 1 + res.report.tenants[0]["new_trees"]


def test_recorded_radii_equal_recomputed_ones():
    """The radii a compaction records are what reading every member would give: placing with
    them or without them (state radius dropped) makes the same store."""
    res = _sequence(4)[-1]
    store = append(res.store, store_of(arrivals(9, 12, ["a", "b", "c"])))
    bare = append(res.store, store_of(arrivals(9, 12, ["a", "b", "c"])))
    bare.event_trees.tenants = {t: dataclasses.replace(s, radius=None) for t, s in bare.event_trees.tenants.items()}
    assert all(s.radius is not None for s in store.event_trees.tenants.values())
    a, b = compact(store, BUDGET, PAPER, device="cpu"), compact(bare, BUDGET, PAPER, device="cpu")
    assert same_store(a.store, b.store)


def test_append_refuses_an_original_the_store_holds():
    res = compress(store_of(arrivals(0, 40, ["a"])), PAPER, device="cpu").store
    merged = next(s for s in res.sources if len(s) > 1)
    again = [r for r in arrivals(0, 40, ["a"]) if r["id"] == merged[-1]]
    with pytest.raises(ValueError, match="must not be in the store already"):
        append(res, store_of(again))
