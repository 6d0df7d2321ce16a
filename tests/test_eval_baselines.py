"""The baselines (docs/method.md "Baselines") and method specs: exact ratios, tenancy, coverage, known answers."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from eval_fixtures import FACTS, BagOfWordsEmbedder, duplicate_facts_benchmark

from memforest_gpu.config import CompressConfig, MergeConfig, PartitionConfig, SpanningConfig
from memforest_gpu.engine.quotas import removal_target
from memforest_gpu.evaluation.methods import (
    ABLATION_METHODS,
    ABLATIONS,
    DEFAULT_METHODS,
    MethodSpec,
    compress_with,
    parse_method,
)
from memforest_gpu.store.memory_store import MemoryStore
from memforest_gpu.store.synthetic import synthetic_store

PRUNING = ("random_prune", "kmeans_prune", "dart")
MERGING = ("random_merge", "tome")


def _store():
    parts = [synthetic_store(n, dim=32, seed=s) for n, s in ((37, 1), (60, 2), (5, 3))]
    ids, texts, ts, ten, emb = [], [], [], [], []
    for j, s in enumerate(parts):
        ids += [f"t{j}-{i}" for i in s.ids]
        texts += s.texts
        ts += s.timestamps.tolist()
        ten += [f"t{j}"] * len(s)
        emb.append(s.embeddings)
    st = MemoryStore.from_columns(ids=ids, texts=texts, timestamps=ts, embeddings=torch.cat(emb), tenants=ten)
    perm = np.random.default_rng(0).permutation(len(st)).tolist()  # tenants interleaved
    return st.take(perm)


class _Proj:
    """Embeds by looking the text up in a table (merged text: mean of its sentences' rows)."""

    name = "lookup"
    max_tokens = None

    def __init__(self, store):
        self.table = dict(zip(store.texts, store.embeddings))
        self.dim = store.dim

    def embed(self, texts):
        rows = []
        for t in texts:
            hits = [v for k, v in self.table.items() if k in t] or [torch.ones(self.dim)]
            rows.append(torch.nn.functional.normalize(torch.stack(hits).sum(0), dim=0))
        return torch.stack(rows)


@pytest.mark.parametrize("method", PRUNING + MERGING)
@pytest.mark.parametrize("ratio", [0.3, 0.7])
def test_exact_ratio_tenancy_and_coverage(method, ratio):
    st = _store()
    res = compress_with(method, st, CompressConfig(merge=MergeConfig(ratio=ratio, seed=3)), embedder=_Proj(st))
    out = res.store
    n_in, n_out = Counter(st.tenants), Counter(out.tenants)
    for t, n in n_in.items():
        assert n - n_out[t] == removal_target(n, ratio), (t, n, n_out[t])
    tenant_of = dict(zip(st.ids, st.tenants))
    for t, src in zip(out.tenants, out.sources):
        assert {tenant_of[s] for s in src} == {t}  # nothing crosses a tenant
    seen = Counter(s for src in out.sources for s in src)
    assert all(c == 1 for c in seen.values())
    if method in MERGING:
        assert set(seen) == set(st.ids)  # no original dropped without a node that contains it
    else:
        assert all(len(s) == 1 for s in out.sources)
    assert res.report.nodes_out == len(out) and res.report.shortfall == 0
    torch.testing.assert_close(out.embeddings.norm(dim=1), torch.ones(len(out)), atol=1e-5, rtol=0)
    # same seed, same result
    again = compress_with(method, st, CompressConfig(merge=MergeConfig(ratio=ratio, seed=3)), embedder=_Proj(st))
    assert again.store.ids == out.ids and again.store.texts == out.texts


def test_seed_changes_random_choices():
    st = _store()
    a = compress_with("random_prune", st, CompressConfig(merge=MergeConfig(ratio=0.5, seed=0))).store.ids
    b = compress_with("random_prune", st, CompressConfig(merge=MergeConfig(ratio=0.5, seed=1))).store.ids
    assert a != b


def _clusters(n_per=(5, 5, 5), dim=8):
    g = torch.Generator().manual_seed(0)
    rows, ids = [], []
    for c, n in enumerate(n_per):
        centre = torch.zeros(dim)
        centre[c] = 1.0
        for i in range(n):
            rows.append(centre + 0.05 * torch.randn(dim, generator=g))
            ids.append(f"c{c}-{i}")
    return MemoryStore.from_columns(ids=ids, texts=ids, timestamps=list(range(len(ids))), embeddings=torch.stack(rows))


def test_kmeans_prune_keeps_one_per_cluster():
    st = _clusters()
    out = compress_with("kmeans_prune", st, CompressConfig(merge=MergeConfig(ratio=0.8))).store
    assert sorted(i.split("-")[0] for i in out.ids) == ["c0", "c1", "c2"]


def test_dart_keeps_what_is_least_like_the_pivots():
    st = _clusters((20, 20, 10))  # 2% of 50 -> one pivot
    out = compress_with("dart", st, CompressConfig(merge=MergeConfig(ratio=0.6, seed=0))).store
    groups = Counter(i.split("-")[0] for i in out.ids)
    assert len(out) == 20 and sum(groups.values()) == 20
    # the pivot's cluster is kept only through the pivot itself
    assert sorted(groups.values())[0] == 1


def test_merging_baselines_respect_the_cap():
    st = _store()
    emb = _Proj(st)
    for method in MERGING:
        cfg = CompressConfig(merge=MergeConfig(ratio=0.5, max_node_tokens=40))
        out = compress_with(method, st, cfg, embedder=emb).store
        assert max(len(t.split()) for t in out.texts) <= 40 * 2  # word pieces ~ words here; generous bound
        counts = [len(t.split()) + 2 * t.count("[") for t in out.texts]
        assert max(counts) <= 40 + 40  # no runaway node


def test_tome_and_memforest_on_duplicate_facts():
    """Only merging each fact with its copy keeps every fact whole: MemForest's maximum
    spanning tree does; ToMe's alternating split puts both copies of a fact on one side."""
    b = duplicate_facts_benchmark(("t0",))
    emb = BagOfWordsEmbedder()
    st = b.store(emb)
    cfg = parse_method("memforest").config(CompressConfig(), ratio=0.5, seed=0)
    mf = compress_with("memforest", st, cfg, embedder=emb).store
    assert sorted(mf.texts) == sorted(f[0] for f in FACTS)
    assert all(len(s) == 2 for s in mf.sources)
    tm = compress_with("tome", st, CompressConfig(merge=MergeConfig(ratio=0.5)), embedder=emb).store
    assert len(tm) == 4 and {f[0] for f in FACTS} - set(tm.texts)  # some fact survives only inside a pair


def test_method_specs():
    assert parse_method("memforest") == MethodSpec("memforest", "sequential")
    assert parse_method("memforest-min-spanning:matching") == MethodSpec("memforest-min-spanning", "matching")
    assert parse_method("tome").label == "tome"
    with pytest.warns(DeprecationWarning, match="'memforest-min-tree' is renamed 'memforest-min-spanning'"):
        assert parse_method("memforest-min-tree:matching") == MethodSpec("memforest-min-spanning", "matching")
    for bad, msg in (("nope", "method must be one of"), ("tome:matching", "only memforest"),
                     ("memforest:fast", "schedule of memforest must be one of")):
        with pytest.raises(ValueError, match=msg):
            parse_method(bad)
    base = CompressConfig(partition=PartitionConfig(alpha=0.1))
    c = parse_method("memforest-no-semantic:matching").config(base, ratio=0.3, seed=2)
    assert (c.partition.use_semantic, c.partition.use_temporal, c.partition.alpha, c.partition.seed) == \
        (False, True, 0.1, 2)
    assert (c.merge.ratio, c.merge.seed, c.merge.schedule) == (0.3, 2, "matching")
    assert parse_method("memforest-no-degree").config(base, ratio=0.5, seed=0).spanning.eta == 1.0
    assert parse_method("memforest-min-spanning").config(base, ratio=0.5, seed=0).spanning.kind == "min"
    assert parse_method("memforest-random-order").config(base, ratio=0.5, seed=0).spanning.kind == "random"
    d = parse_method("memforest-degree-max").config(base, ratio=0.5, seed=0).spanning
    assert (d.degree_norm, d.eta) == ("max", 0.9)
    assert parse_method("memforest-no-time-edges").config(
        CompressConfig(spanning=SpanningConfig(time_weight=0.3)), ratio=0.5, seed=0).spanning.time_weight == 0.0
    assert parse_method("memforest-no-size-edges").config(
        CompressConfig(spanning=SpanningConfig(size_weight=0.3, time_weight=0.5)), ratio=0.5, seed=0).spanning == \
        SpanningConfig(time_weight=0.5, size_weight=0.0)
    p = parse_method("memforest-paper:matching").config(
        CompressConfig(spanning=SpanningConfig(time_weight=0.3, size_weight=0.2), partition=PartitionConfig(alpha=0.2),
                       merge=MergeConfig(max_node_tokens=99)), ratio=0.5, seed=4)
    assert (p.spanning, p.partition.alpha, p.partition.seed, p.merge.max_node_tokens, p.merge.schedule) == \
        (CompressConfig.preset("paper").spanning, 0.05, 4, None, "matching")
    assert parse_method("memforest-dense-graph").config(base, ratio=0.5, seed=0).spanning.graph == "dense"
    assert "memforest-dense-graph" not in ABLATION_METHODS  # the knn graph's reference, not an ablation
    assert len(ABLATIONS) == 10 and "memforest:matching" in DEFAULT_METHODS
    st = _clusters()
    assert compress_with("none", st).store is st
