"""Many tenants as one batch (1,000 tenants of 1-60 nodes): the engine's invariants, tenant
isolation and determinism; the closed form for tenants with K = 1 against the k-means path;
retrieval over many tenants against the one-tenant-at-a-time search; and host reads that
do not grow with the number of tenants (no stage runs device work per tenant)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_helpers import check_invariants, compress_counting_reads, same_output
from host_reads import count_host_reads
from margins import assert_enough, dot_tolerance, retrieval_margins

from memforest_gpu.config import CompressConfig, MergeConfig, PartitionConfig, RetrievalConfig
from memforest_gpu.engine import compress
from memforest_gpu.engine.partition import closed_form_centres, partition_nodes, time_order
from memforest_gpu.kernels.agpr import agpr_rerank, topk_search
from memforest_gpu.kernels.lloyd import cluster_centres, kmeans
from memforest_gpu.retrieval.retriever import Retriever
from memforest_gpu.store.memory_store import MemoryStore


class Concat:
    name = "concat"

    def merge(self, pairs):
        return [f"{p.older.text} {p.newer.text}" for p in pairs]


def many_store(n_tenants: int, *, lo: int = 1, hi: int = 60, dim: int = 16, seed: int = 0,
               grid: bool = False, onehot: bool = False) -> MemoryStore:
    """``n_tenants`` tenants of ``lo..hi`` nodes, rows interleaved. Each tenant walks over a few
    topics; some timestamps repeat. ``grid``: small-integer vectors (many exact duplicates and
    equal distances, for tie rules); ``onehot``: +-1 on one axis (exactly equal similarities in
    any summation order)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(lo, hi + 1, n_tenants)
    code = np.repeat(np.arange(n_tenants), sizes)
    N = len(code)
    if onehot:
        E = np.zeros((N, dim), dtype=np.float32)
        E[np.arange(N), rng.integers(0, dim, N)] = rng.choice([-1.0, 1.0], N)
    elif grid:
        E = rng.integers(-1, 2, (N, dim)).astype(np.float32)
        E[(E == 0).all(1), 0] = 1.0
    else:
        topics = rng.standard_normal((n_tenants, 3, dim)).astype(np.float32)
        E = topics[code, rng.integers(0, 3, N)] + 0.5 * rng.standard_normal((N, dim)).astype(np.float32)
    ts = 1.6e9 + 3600.0 * rng.integers(0, 500, N)  # repeats inside a tenant
    perm = rng.permutation(N)
    local = np.arange(N) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    return MemoryStore.from_columns(
        ids=[f"u{code[i]}-{local[i]}" for i in perm], texts=[f"user {code[i]} note {local[i]}." for i in perm],
        timestamps=ts[perm].tolist(), embeddings=torch.from_numpy(E[perm]),
        tenants=[f"user-{code[i]}" for i in perm])


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def store():
    return many_store(1000, seed=1)


def _cfg(schedule, **part):
    return CompressConfig(partition=PartitionConfig(**part), merge=MergeConfig(ratio=0.5, schedule=schedule))


# --------------------------------------------------------------------------- the closed form
@pytest.mark.parametrize("grid", [False, True])
def test_closed_form_centre_is_the_kmeans_centre(grid):
    """Every tenant run through the batched k-means with K = 1 and cluster_centres: the same
    centre node as the closed form, duplicates and ties included."""
    st = many_store(300, lo=1, hi=40, dim=8, seed=7, grid=grid)
    names, codes = st.tenant_index()
    X = torch.nn.functional.normalize(st.embeddings, dim=1)
    order = time_order(codes, st.timestamps)
    n_ten = len(names)
    got = closed_form_centres(X, order, codes, torch.ones(n_ten, dtype=torch.bool), n_ten)
    # the k-means path: one padded row per tenant in time order, K = 1
    sizes = torch.bincount(codes, minlength=n_ten)
    n = int(sizes.max())
    starts = torch.cumsum(sizes, 0) - sizes
    col = torch.arange(n)
    val = col[None] < sizes[:, None]
    idx = torch.where(val, order[(starts[:, None] + col[None]).clamp(max=len(order) - 1)], -1)
    Xp = X[idx.clamp(min=0)] * val[:, :, None]
    labels, means, c_valid, _ = kmeans(Xp, val, torch.ones(n_ten, dtype=torch.int64))
    cen = cluster_centres(Xp, val, labels, means, c_valid)[:, 0]
    want = idx[torch.arange(n_ten), cen]
    assert torch.equal(got, want)
    if grid:  # ties happened: several members at the least distance, the earliest one won
        d = ((Xp - means[:, :1]) ** 2).sum(-1).masked_fill(~val, float("inf"))
        assert int(((d == d.min(1, keepdim=True).values) & val).sum(1).gt(1).sum()) > 10


@pytest.mark.parametrize("seeding", ["batched", "k-means||", "k-means++"])
def test_partition_closed_form_equals_kmeans_path(seeding):
    """K = 1 tenants (alpha = 0.001): the partition's trees and centres equal a partition
    where the same tenants go through k-means (forced here by running them with K = 1 one at
    a time through the k-means kernel, as the engine did before the closed form)."""
    st = many_store(200, lo=1, hi=60, dim=8, seed=3, grid=True)
    names, codes = st.tenant_index()
    X = torch.nn.functional.normalize(st.embeddings, dim=1)
    p = partition_nodes(X, st.timestamps, codes, names, PartitionConfig(alpha=0.001, seeding=seeding))
    assert p.tree_tenant.tolist() == list(range(len(names)))  # one tree per tenant
    assert torch.equal(p.tree, codes) and p.moved == 0
    order = time_order(codes, st.timestamps)
    for t in range(0, len(names), 17):
        rows = order[codes[order] == t]
        lab, means, cv, _ = kmeans(X[rows][None], torch.ones(1, len(rows), dtype=torch.bool), torch.tensor([1]),
                                   seeding=seeding)
        c = cluster_centres(X[rows][None], torch.ones(1, len(rows), dtype=torch.bool), lab, means, cv)[0, 0]
        assert int(p.centre[t]) == int(rows[c]), t


# --------------------------------------------------------------------------- the engine on 1,000 tenants
@pytest.fixture(scope="module", params=["sequential", "matching"])
def run_1000(request, store):
    """(schedule, config, result) of compressing the 1,000-tenant store, once per schedule."""
    cfg = _cfg(request.param)
    return request.param, cfg, compress(store, cfg, merger=Concat(), device="cpu")


def test_invariants_on_1000_tenants(store, run_1000):
    _, _, res = run_1000
    check_invariants(store, res, 0.5)
    assert len(res.report.tenants) == 1000
    # check_invariants: a tenant falls short only when every one of its trees is down to one node
    assert sum(r["removed"] for r in res.report.tenants) == res.report.merges > 0


def test_isolation_and_determinism_on_1000_tenants(store, run_1000):
    _, cfg, full = run_1000
    again = compress(store, cfg, merger=Concat(), device="cpu")
    assert same_output(full.store, again.store)
    assert [(m.a, m.b, m.into) for m in full.merges] == [(m.a, m.b, m.into) for m in again.merges]
    names = store.tenant_names()
    sizes = {r["tenant"]: r["nodes_in"] for r in full.report.tenants}
    picks = [names[0], max(names, key=sizes.get), min(names, key=sizes.get)] + names[100::150]
    for t in picks:
        alone = compress(store.select_tenant(t), cfg, merger=Concat(), device="cpu")
        assert same_output(alone.store, full.store.select_tenant(t)), t
        row = next(r for r in full.report.tenants if r["tenant"] == t)
        assert alone.report.tenants[0] == row


# --------------------------------------------------------------------------- retrieval
def _per_tenant_search(store, q, tenants, cfg):
    """The one-tenant-at-a-time search (the retriever before the grouped layout)."""
    Q, k = q.shape[0], cfg.k
    q = torch.nn.functional.normalize(q, dim=1)
    index = torch.full((Q, k), -1, dtype=torch.int64)
    score = torch.full((Q, k), float("-inf"))
    names, codes = store.tenant_index()
    for t in sorted(set(tenants)):
        qi = torch.tensor([i for i, x in enumerate(tenants) if x == t])
        rows = torch.nonzero(codes == names.index(t)).flatten()
        sims, cand = topk_search(q[qi], store.embeddings[rows], cfg.L * k if cfg.agpr else k)
        v = sims
        if cfg.agpr:
            order, v = agpr_rerank(sims, store.timestamps[rows][cand.clamp(min=0)], cand >= 0, k, lam=cfg.lam,
                                   gamma=cfg.gamma)
            cand = cand.gather(1, order)
            v = torch.where(cand >= 0, v, torch.full_like(v, float("-inf")))
        kk = cand.shape[1]
        index[qi, :kk] = torch.where(cand >= 0, rows[cand.clamp(min=0)], -1)
        score[qi, :kk] = v
    return index, score


@pytest.mark.parametrize("agpr", [False, True])
@pytest.mark.parametrize("large", [4096, 20])
def test_batched_retrieval_equals_per_tenant_search(agpr, large):
    st = many_store(400, lo=1, hi=60, dim=16, seed=5)
    names = st.tenant_names()
    g = torch.Generator().manual_seed(0)
    q = torch.randn(300, st.dim, generator=g)
    tens = [names[int(i)] for i in torch.randint(0, len(names), (300,), generator=g)]
    cfg = RetrievalConfig(k=10, agpr=agpr)
    r = Retriever(st)
    r.large = large  # 20: tenants above 20 rows take the per-segment path, the rest the padded one
    got = r.search(q, tenants=tens, config=cfg)
    want_i, want_s = _per_tenant_search(st, q, tens, cfg)
    # the padded groups (bmm) and the per-tenant search (mm) may round differently: rows are
    # compared where no near-tie decides them (margins.py), scores everywhere a pool agrees
    tol = dot_tolerance(st.dim)
    rows = {t: np.flatnonzero(np.asarray(st.tenants) == t) for t in set(tens)}
    ok = torch.from_numpy(retrieval_margins(st.embeddings, st.timestamps, [rows[t] for t in tens], q, k=cfg.k,
                                            agpr=agpr, L=cfg.L, lam=cfg.lam, gamma=cfg.gamma) > tol)
    assert_enough(ok.numpy(), 250, "queries")
    assert torch.equal(got.index[ok], want_i[ok])
    torch.testing.assert_close(got.score[ok], want_s[ok], rtol=0, atol=tol)
    own = [[st.tenants[j] for j in row if j >= 0] for row in got.index.tolist()]
    assert all(set(o) <= {t} for o, t in zip(own, tens))


def test_batched_retrieval_ties_go_to_the_lower_row():
    st = many_store(50, lo=1, hi=30, dim=4, seed=2, onehot=True)  # many exactly equal similarities
    names = st.tenant_names()
    q = torch.tensor([[0.5, 0.5, 0.0, -0.5]]).repeat(len(names), 1)
    for agpr in (False, True):
        cfg = RetrievalConfig(k=5, agpr=agpr)
        got = Retriever(st).search(q, tenants=names, config=cfg)
        want_i, _ = _per_tenant_search(st, q, names, cfg)
        assert torch.equal(got.index, want_i)


def _tensors_held(r) -> int:
    n = 0
    for v in vars(r).values():
        items = v.values() if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else [v]
        n += sum(isinstance(x, torch.Tensor) for x in items)
    return n


def test_retriever_builds_nothing_per_tenant(store):
    """The retriever holds the same few tensors for 10 tenants as for 1,000 (no per-tenant copies)."""
    few = Retriever(many_store(10, seed=1))
    many = Retriever(store)
    assert _tensors_held(few) == _tensors_held(many) <= 6


# --------------------------------------------------------------------------- no per-tenant device work
def _setup_reads(st, schedule):
    return compress_counting_reads(st, _cfg(schedule, alpha=0.001), Concat())[2]


@pytest.mark.parametrize("schedule", ["sequential", "matching"])
def test_host_reads_do_not_grow_with_tenants(schedule):
    """Partition (closed form), quotas, trees and every round read the device as often for
    1,000 tenants as for 100: nothing runs per tenant."""
    few = _setup_reads(many_store(100, lo=20, hi=60, seed=4), schedule)
    many = _setup_reads(many_store(1000, lo=20, hi=60, seed=4), schedule)
    assert few[0] == many[0], (few[:3], many[:3])  # everything up to the end of round 1
    assert max(few[1:]) == max(many[1:]), (few, many)
    g = torch.Generator().manual_seed(0)
    counts = []
    for n in (100, 1000):
        st = many_store(n, lo=20, hi=60, seed=4)  # the same two size classes of segments
        names = st.tenant_names()
        r = Retriever(st)
        q = torch.randn(n, st.dim, generator=g)
        with count_host_reads() as reads:
            r.search(q, tenants=names, config=RetrievalConfig(k=10, agpr=True))
        counts.append(reads.total)
    assert counts[0] == counts[1], counts
