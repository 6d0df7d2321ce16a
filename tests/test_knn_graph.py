"""The knn graph (``SpanningConfig.graph = "knn"``): trees without a dense matrix.

- Exact mode: with ``knn`` at least the largest tree's size - 1 every tree keeps every pair
  and its cosines come from the dense graph's own functions, so the run equals the dense
  graph's merge for merge (records in order, similarities, output), on trees of 1,000 to
  4,000 nodes, both schedules, with and without the edge terms, degree normalisation and a
  strict node cap.
- A small ``knn``: every compression invariant holds; after every round
  each list points at live slots only, its last column is the next live slot, and every
  stored cosine is the float64-accumulated dot product of the current vectors.
- ``alpha = 0``: one tree per tenant.
"""
from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest
import torch
from engine_helpers import _one_thread, build_store, check_invariants  # noqa: F401
from paper import paper_config, paper_merge

from memforest_gpu import compress
from memforest_gpu.config import CompressConfig, MergeConfig, PartitionConfig, SpanningConfig, preset
from memforest_gpu.engine.compression import setup_run
from memforest_gpu.engine.knn_graph import next_live
from memforest_gpu.engine.memory import MemoryPlan
from memforest_gpu.engine.node_vectors import dot64
from memforest_gpu.engine.partition import partition_nodes
from memforest_gpu.engine.plan import dense_candidates, knn_candidates
from memforest_gpu.store import MemoryStore
from memforest_gpu.store.synthetic import synthetic_store

round_module = importlib.import_module("memforest_gpu.engine.compression")
EXACT = 1 << 20  # knn at least every tree's size: every pair kept


def one_tree_store(sizes, *, dim=32, seed=0) -> MemoryStore:
    """One tenant per size, clustered vectors drifting in time (tenants named t0, t1, ...)."""
    parts = [synthetic_store(n, dim=dim, seed=seed + j) for j, n in enumerate(sizes)]
    return MemoryStore.from_columns(
        ids=[f"t{j}-{i}" for j, p in enumerate(parts) for i in p.ids],
        texts=[t for p in parts for t in p.texts],
        timestamps=[t for p in parts for t in p.timestamps.tolist()],
        embeddings=torch.cat([p.embeddings for p in parts]),
        tenants=[f"t{j}" for j, p in enumerate(parts) for _ in range(len(p))])


def with_spanning(cfg: CompressConfig, **spanning) -> CompressConfig:
    return dataclasses.replace(cfg, spanning=dataclasses.replace(cfg.spanning, **spanning))


def records(res):
    return [(m.round, m.tenant, m.a, m.b, m.into, m.similarity) for m in res.merges]


def assert_same_run(a, b):
    assert records(a) == records(b)
    assert a.store.ids == b.store.ids and a.store.texts == b.store.texts
    assert torch.equal(a.store.embeddings, b.store.embeddings)
    assert a.report.rounds == b.report.rounds and a.report.shortfall == b.report.shortfall


# --------------------------------------------------------------------------- exact mode
EXACT_CASES = {
    # name: (tree sizes, config)
    "memforest-4000+1000": ([4000, 1000], dataclasses.replace(preset("memforest"),
                                                                partition=PartitionConfig(alpha=0.0))),
    "paper-terms-1500": ([1500], CompressConfig(partition=PartitionConfig(alpha=0.0),
                                                merge=MergeConfig(ratio=0.7, schedule="matching"))),
    "degree-max-strict-cap-1200": ([1200], CompressConfig(
        partition=PartitionConfig(alpha=0.0), spanning=SpanningConfig(degree_norm="max", eta=0.9, size_weight=0.3),
        merge=MergeConfig(ratio=0.5, schedule="matching", max_node_tokens=40, cap_policy="strict"))),
    "sequential-1000": ([1000], CompressConfig(partition=PartitionConfig(alpha=0.0),
                                               spanning=SpanningConfig(time_weight=0.3),
                                               merge=MergeConfig(ratio=0.03, schedule="sequential"))),
}


@pytest.mark.parametrize("case", list(EXACT_CASES))
def test_exact_mode_equals_the_dense_graph(case):
    sizes, cfg = EXACT_CASES[case]
    store = one_tree_store(sizes, seed=len(case))
    dense = compress(store, with_spanning(cfg, graph="dense"), device="cpu")
    exact = compress(store, with_spanning(cfg, graph="knn", knn=EXACT, knn_above=0), device="cpu")
    assert dense.report.trees == len(sizes) and dense.merges
    assert_same_run(dense, exact)


@pytest.mark.parametrize("schedule", ["sequential", "matching"])
def test_trees_of_at_most_knn_plus_one_nodes_are_exact(schedule):
    """A bucket whose largest tree has knn + 1 nodes (the boundary) keeps every pair: many
    small trees of the paper's partition give the dense graph's run."""
    store = build_store([300, 200, 90], dim=16, seed=4)
    cfg = paper_config(merge=paper_merge(ratio=0.5, schedule=schedule))
    sizes = np.bincount(partition_nodes(
        store.embeddings, store.timestamps, store.tenant_index()[1], store.tenant_names(), cfg.partition).tree)
    assert len(sizes) > 10 and sizes.max() > 17
    exact = with_spanning(cfg, knn=int(sizes.max()) - 1, knn_above=0)
    assert_same_run(compress(store, with_spanning(cfg, graph="dense"), device="cpu"),
                    compress(store, exact, device="cpu"))


# --------------------------------------------------------------------------- the knn graph
def check_knn_graph(batch):
    """Every knn bucket: entries of live slots point at other live slots, the last column
    is the next live slot, dead slots list nothing, cosines are the current vectors' ones."""
    for bk in batch.buckets:
        if bk.graph != "knn":
            continue
        live = bk.slot >= 0
        assert bk.nbr.dtype == torch.int32  # the slots at their width
        nbr = bk.nbr.long()
        k = nbr.shape[2] - 1
        assert (nbr[~live] == -1).all()
        own = torch.arange(bk.m)[None, :, None]
        ok = nbr >= 0
        assert not (ok & (nbr == own)).any()
        tgt_live = live.gather(1, nbr.clamp(min=0).view(nbr.shape[0], -1)).view(nbr.shape)
        assert (tgt_live | ~ok).all()
        assert torch.equal(torch.where(live, next_live(bk.slot), -1), nbr[..., k])
        rows_a = bk.slot[:, :, None].expand_as(nbr)[ok]
        rows_b = bk.slot.gather(1, nbr.clamp(min=0).view(nbr.shape[0], -1)).view(nbr.shape)[ok]
        want = dot64(batch.vectors.gather(rows_a), batch.vectors.gather(rows_b), batch.vectors.dtype)
        # both float64-accumulated, in two summation orders (dot64 / dot64_many): equal after
        # rounding to float32 save for values within 1e-16 of a boundary, so one ulp is allowed
        torch.testing.assert_close(bk.cs[ok], want, rtol=0, atol=2.0 ** -23)


@pytest.mark.parametrize("schedule", ["sequential", "matching"])
def test_the_knn_graph_stays_consistent_round_after_round(monkeypatch, schedule):
    store = one_tree_store([300, 120], dim=16, seed=5)
    cfg = CompressConfig(partition=PartitionConfig(alpha=0.0),
                         spanning=SpanningConfig(knn_above=0, knn=4, time_weight=0.3, size_weight=0.2),
                         merge=MergeConfig(ratio=0.6 if schedule == "matching" else 0.2, schedule=schedule))
    seen = []
    real = round_module.apply_round

    def checked(batch, *a, **kw):
        real(batch, *a, **kw)
        check_knn_graph(batch)
        seen.append(1)

    monkeypatch.setattr(round_module, "apply_round", checked)
    res = compress(store, cfg, device="cpu")
    check_invariants(store, res, cfg.merge.ratio)
    assert len(seen) == res.report.rounds > 1


@pytest.mark.parametrize("schedule", ["sequential", "matching"])
def test_a_round_split_into_groups_of_trees_is_the_same_run(monkeypatch, schedule):
    """A round's knn buckets are updated a group of touched trees at a time when their
    merged nodes' products with their trees exceed a budget: groups of one tree or a few
    give the run of one group, and the graph stays consistent."""
    apply_module = importlib.import_module("memforest_gpu.engine.apply")
    store = build_store([400, 260, 90], dim=16, seed=11)
    cfg = CompressConfig(partition=PartitionConfig(alpha=0.02),
                         spanning=SpanningConfig(knn_above=0, knn=4, time_weight=0.3, size_weight=0.2),
                         merge=MergeConfig(ratio=0.5, schedule=schedule))
    whole = compress(store, cfg, device="cpu")
    assert whole.report.trees > 3
    groups = []
    real_groups = apply_module._groups

    def counted(cost, budget):
        out = real_groups(cost, budget)
        groups.append(len(out))
        return out

    monkeypatch.setattr(apply_module, "_groups", counted)
    for budget in (1, 4000):  # one tree per group, a few
        monkeypatch.setattr(apply_module, "ROUND_BLOCK_BYTES", {"cpu": budget})
        groups.clear()
        assert_same_run(whole, compress(store, cfg, device="cpu"))
        assert max(groups) > 1


def test_the_apply_reads_merged_vectors_a_group_of_trees_at_a_time(monkeypatch):
    """The merged nodes' vectors are read from the run's table by each group of touched trees
    (one tree a group here), never as one block of a bucket's pairs (at 1M nodes that block
    was 300 MB over the round's peak); the run is the same as with the default budget,
    also where the merged vectors go into the input's dead rows (``MemoryPlan(overwrite_input=True)``)."""
    apply_module = importlib.import_module("memforest_gpu.engine.apply")
    vectors_module = importlib.import_module("memforest_gpu.engine.node_vectors")
    store = build_store([400, 260, 90], dim=16, seed=11)
    cfg = CompressConfig(partition=PartitionConfig(alpha=0.02),
                         spanning=SpanningConfig(knn_above=0, knn=4, time_weight=0.3, size_weight=0.2),
                         merge=MergeConfig(ratio=0.5, schedule="matching", keys=0))
    whole = compress(build_store([400, 260, 90], dim=16, seed=11), cfg, device="cpu",
                     memory=MemoryPlan(overwrite_input=True))
    reads, most, pairs, reused, refreshing = [], [], [], [], []
    real_apply, real_gather = round_module.apply_round, vectors_module.NodeVectors.gather
    real_refresh = apply_module._refresh

    def refresh(*a, **k):  # the stale entries' ends: read in cache-sized blocks, not counted here
        refreshing.append(1)
        try:
            return real_refresh(*a, **k)
        finally:
            refreshing.pop()

    def apply(batch, plan, *a, **k):
        most.append(int(np.bincount(plan.tree_np).max()))  # the most pairs of a tree this round
        pairs.append(len(plan))
        reads.append(0)
        try:
            return real_apply(batch, plan, *a, **k)
        finally:
            reused.append(batch.vectors.reuse)

    def gather(self, rows):
        inside = len(reads) > len(reused) and not refreshing  # in a round's apply, not its refresh
        if inside and rows.dim() == 1 and rows.numel() and bool((rows >= self.n_base).all()):
            reads[-1] = max(reads[-1], rows.numel())  # merged nodes' rows read at once
        return real_gather(self, rows)

    monkeypatch.setattr(round_module, "apply_round", apply)
    monkeypatch.setattr(apply_module, "_refresh", refresh)
    monkeypatch.setattr(vectors_module.NodeVectors, "gather", gather)
    monkeypatch.setattr(apply_module, "ROUND_BLOCK_BYTES", {"cpu": 1})
    one = compress(store, cfg, device="cpu", memory=MemoryPlan(overwrite_input=True))
    assert_same_run(whole, one)
    assert all(reused) and max(reads) > 0
    assert all(r <= m for r, m in zip(reads, most)), (reads, most)
    assert any(m < p for m, p in zip(most, pairs))  # rounds whose pairs are in several trees


@pytest.mark.parametrize("schedule", ["sequential", "matching"])
@pytest.mark.parametrize("ratio", [0.3, 0.7])
def test_invariants_with_the_knn_graph(schedule, ratio):
    store = build_store([400, 260, 90, 3, 1], dim=16, seed=7)
    cfg = CompressConfig(partition=PartitionConfig(alpha=0.01),
                         spanning=SpanningConfig(knn_above=0, knn=3, time_weight=0.5, size_weight=0.2),
                         merge=MergeConfig(ratio=ratio, schedule=schedule), storage_dtype="float16")
    a = compress(store, cfg, device="cpu")
    check_invariants(store, a, ratio)
    assert a.report.shortfall == int(ratio >= 0.5)  # only the one-node tenant falls short (round(ratio * 1))
    assert records(compress(store, cfg, device="cpu")) == records(a)  # deterministic


def test_strict_cap_with_the_knn_graph():
    store = build_store([500, 300], dim=16, seed=8)
    cfg = CompressConfig(partition=PartitionConfig(alpha=0.0), spanning=SpanningConfig(knn_above=0, knn=4),
                         merge=MergeConfig(ratio=0.5, schedule="matching", max_node_tokens=60, cap_policy="strict"))
    res = compress(store, cfg, device="cpu")
    check_invariants(store, res, 0.5, capped=True)


def test_tenant_independence_with_the_knn_graph():
    st = build_store([400, 300, 260, 3], dim=16, seed=2)
    cfg = CompressConfig(partition=PartitionConfig(alpha=0.0),
                         spanning=SpanningConfig(knn_above=0, knn=5, time_weight=0.5),
                         merge=MergeConfig(ratio=0.5, schedule="matching"))
    full = compress(st, cfg, device="cpu")
    for t in st.tenant_names():
        alone = compress(st.select_tenant(t), cfg, device="cpu")
        part = full.store.select_tenant(t)
        assert alone.store.ids == part.ids and alone.store.sources == part.sources, t
        assert torch.equal(alone.store.embeddings, part.embeddings), t


def test_alpha_zero_is_one_tree_per_tenant():
    store = build_store([120, 80, 1], dim=16, seed=3)
    res = compress(store, CompressConfig(partition=PartitionConfig(alpha=0.0)), device="cpu")
    assert res.report.trees == 3
    assert [r["trees"] for r in res.report.tenants] == [1, 1, 1]
    with pytest.raises(ValueError, match=r"alpha must be in \[0.0, 1.0\], got -0.1"):
        PartitionConfig(alpha=-0.1)
    for bad, rule in (({"graph": "sparse"}, "graph must be one of"), ({"knn": 0}, "knn must be an integer >= 1"),
                      ({"knn_cells_above": 1}, "knn_cells_above must be an integer >= 2"),
                      ({"knn_above": -1}, "knn_above must be an integer >= 0")):
        with pytest.raises(ValueError, match=rule):
            SpanningConfig(**bad)


def test_small_trees_keep_the_dense_graph_and_big_ones_the_knn_graph():
    """Under graph "knn" a bucket padded to at most knn_above slots keeps its matrix (cheaper
    there, and exact); bigger ones keep the knn graph; the paper preset's small trees run as "dense"."""
    store = build_store([300, 40, 20], dim=16, seed=5)
    cfg = CompressConfig(partition=PartitionConfig(alpha=0.0), spanning=SpanningConfig(knn=8, knn_above=64))
    s = setup_run(store, cfg, device="cpu")
    by_size = {int(bk.slot.shape[1]): bk.graph for bk in s.batch.buckets}
    assert by_size == {300: "knn", 40: "dense", 20: "dense"}, by_size
    paper = preset("paper")
    assert compress(store, paper, device="cpu").store.ids == compress(
        store, with_spanning(paper, graph="dense"), device="cpu").store.ids


@pytest.mark.parametrize("knn", [1, 2, 4])
def test_strict_cap_forest_has_the_dense_pieces(knn):
    """Under a strict cap a pair over it is no edge, so short lists can leave a tree in more
    pieces than the pairs that fit do; the completion joins them: every tree's forest has as
    many edges as the dense graph's (live nodes - pieces of the pairs that fit)."""

    store = build_store([400, 150], dim=16, seed=11)
    cfg = CompressConfig(partition=PartitionConfig(alpha=0.0),
                         spanning=SpanningConfig(knn_above=0, knn=knn, size_weight=0.3),
                         merge=MergeConfig(ratio=0.5, schedule="matching", max_node_tokens=24, cap_policy="strict"))
    counts = {}
    for graph in ("knn", "dense"):
        c = with_spanning(cfg, graph=graph)
        s = setup_run(store, c, device="cpu")
        need = np.ones(len(s.quotas.per_tree), dtype=bool)
        if graph == "knn":
            cand, _ = knn_candidates(s.batch, need, c, s.plan_cap, True)
            assert all(bk.graph == "knn" for bk in s.batch.buckets)
        else:
            cand, _ = dense_candidates(s.batch, need, c, s.plan_cap, None, True)
        counts[graph] = np.bincount(cand.tree[cand.eligible].numpy(), minlength=len(need))
    live = s.quotas.tree_size
    assert (counts["dense"] < live - 1).all()  # the cap splits both trees
    np.testing.assert_array_equal(counts["knn"], counts["dense"])


@pytest.mark.parametrize("schedule", ["sequential", "matching"])
def test_mixed_buckets_plan_as_the_knn_planner(schedule):
    """Small trees take the dense planner and big ones the knn planner in the same round;
    the merges are those of the knn planner everywhere (knn_above 0), merge for merge (the
    small trees hold at most knn + 1 nodes, so every pair is a candidate either way)."""
    store = build_store([300, 150, 9, 6, 3], dim=16, seed=8)
    cfg = CompressConfig(partition=PartitionConfig(alpha=0.0),
                         spanning=SpanningConfig(knn=8, time_weight=0.3, size_weight=0.2),
                         merge=MergeConfig(ratio=0.6, schedule=schedule))
    s = setup_run(store, cfg, device="cpu")
    assert {bk.graph for bk in s.batch.buckets} == {"knn", "dense"}  # both planners in every round
    assert_same_run(compress(store, with_spanning(cfg, knn_above=0), device="cpu"), compress(store, cfg, device="cpu"))


def test_knn_graph_of_trees_in_order_of_size_cut_to_each_chunk_is_the_padded_one(monkeypatch):
    """build_knn_graph takes a bucket's trees in order of size, each chunk cut to its largest
    tree's slots: the graph is the one of the whole padded bucket, bit for bit, here with trees
    of 65 to 128 nodes in one bucket, chunks of one to three trees, and duplicated vectors (exact
    ties among the candidates). So are a round's products (row_sims)."""
    from memforest_gpu.engine import knn_graph as graph_mod
    from memforest_gpu.engine import node_vectors as vectors_mod

    sizes = [128, 70, 90, 71, 100, 127, 65]
    store = one_tree_store(sizes, dim=16, seed=3)
    emb = store.embeddings.clone()
    emb[10:30] = emb[5]  # duplicates in the first tree
    store = MemoryStore.from_columns(ids=store.ids, texts=store.texts, timestamps=store.timestamps.tolist(),
                                     embeddings=emb, tenants=store.tenants)
    cfg = CompressConfig(partition=PartitionConfig(alpha=0.0), spanning=SpanningConfig(knn=8, knn_above=64))
    s = setup_run(store, cfg, device="cpu")
    (bk,) = [b for b in s.batch.buckets if b.graph == "knn"]
    assert bk.slot.shape == (len(sizes), 128)
    tree_sizes = (bk.slot >= 0).sum(1).numpy()
    assert (bk.sizes == tree_sizes).all()
    for rows in (1, 2, 3):
        for mod in (graph_mod, vectors_mod):
            monkeypatch.setattr(mod, "stream_rows", lambda dev, nbytes, rows=rows: 4 * rows)
        padded = graph_mod.build_knn_graph(dataclasses.replace(bk, sizes=None), s.batch.vectors, cfg.spanning,
                                           s.batch.cap)
        cut = graph_mod.build_knn_graph(bk, s.batch.vectors, cfg.spanning, s.batch.cap)
        assert torch.equal(padded[0], cut[0]) and torch.equal(padded[1], cut[1])
        assert torch.equal(padded[0], bk.nbr) and torch.equal(padded[1], bk.cs)
        # a round's products of merged vectors with their trees stop at each block's largest tree too
        r = np.array([0, 0, 1, 3, 3, 3, 6, 2])
        E = torch.nn.functional.normalize(torch.randn(len(r), 16, generator=torch.Generator().manual_seed(1)), dim=-1)
        whole = vectors_mod.row_sims(s.batch.vectors, bk.slot, r, E)
        assert torch.equal(whole, vectors_mod.row_sims(s.batch.vectors, bk.slot, r, E, sizes=bk.sizes))
        assert bool((whole[:, 70:][torch.as_tensor(tree_sizes[r] <= 70)] == 0).all())
