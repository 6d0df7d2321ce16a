"""Tests for memforest_gpu.retrieval.retriever: plain top-k and AGPR (docs/method.md section 4), per tenant."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from margins import dot_tolerance, retrieval_margins

from memforest_gpu.config import RetrievalConfig
from memforest_gpu.retrieval.retriever import Retriever, SearchResult, search
from memforest_gpu.store.memory_store import MemoryStore

D = 16
T0 = 1.6e9
SIZES = {"alice": 60, "bob": 45, "carol": 7, "dave": 1}


def make_store(seed=0, tie_times=True) -> MemoryStore:
    """Tenants interleaved in row order; some equal timestamps so dense ranks matter."""
    rng = np.random.default_rng(seed)
    tenants = [t for t, n in SIZES.items() for _ in range(n)]
    rng.shuffle(tenants)
    n = len(tenants)
    ts = T0 + 3600.0 * rng.integers(0, 40 if tie_times else 10**6, n)
    return MemoryStore.from_columns(
        ids=[f"n{i}" for i in range(n)], texts=[f"memory {i}" for i in range(n)], timestamps=ts.tolist(),
        embeddings=rng.standard_normal((n, D)).astype(np.float32), tenants=tenants)


@pytest.fixture(scope="module")
def store():
    return make_store()


@pytest.fixture(scope="module")
def queries():
    return torch.from_numpy(np.random.default_rng(1).standard_normal((9, D)).astype(np.float32))


def rows_of(store, tenant):
    return [i for i, t in enumerate(store.tenants) if t == tenant]


def np_unit(x):
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def assert_separated(store, queries, tenant, k, **agpr):
    """The references below are float64, the engine float32: their rankings are compared
    exactly, which is only meaningful where no near-tie decides them. The fixture is chosen
    so that every deciding gap exceeds the float32 rounding bound; this says so if it did not."""
    rows = np.asarray(rows_of(store, tenant))
    m = retrieval_margins(store.embeddings, store.timestamps, [rows] * len(queries), torch.as_tensor(queries),
                          k=k, agpr=bool(agpr), **agpr)
    assert (m > dot_tolerance(store.dim)).all(), (tenant, k, agpr, m.min())


def ref_topk(store, q, tenant, k):
    rows = rows_of(store, tenant)
    E = store.embeddings.numpy().astype(np.float64)[rows]
    s = E @ np_unit(q)
    order = np.argsort(-s, kind="stable")[:k]  # ties: lower index first
    return [rows[j] for j in order], s[order]


def ref_agpr(store, q, tenant, k, L=4, lam=0.2, gamma=0.9):
    """docs/method.md section 4, in plain Python on one tenant's nodes."""
    rows = rows_of(store, tenant)
    E = store.embeddings.numpy().astype(np.float64)[rows]
    ts = store.timestamps.numpy()[rows]
    s = E @ np_unit(q)
    # 1. candidates: the L*k most similar (ties: lower index)
    cand = sorted(range(len(rows)), key=lambda j: (-s[j], j))[: L * k]
    # 2. anchors: the top max(1, floor(lam*k + 0.5)) candidates
    n_anchor = max(1, math.floor(lam * k + 0.5))
    anchors = cand[:n_anchor]
    # 3. dense rank of the candidates' timestamps
    distinct = sorted({ts[j] for j in cand})
    pos = {j: distinct.index(ts[j]) for j in cand}
    # 4. propagation, anchors included (summed in a fixed order, so equal distance sets tie exactly)
    p = {j: math.fsum(sorted(math.exp(-abs(pos[j] - pos[a])) for a in anchors)) / len(anchors) for j in cand}
    # 5. final score, top k (ties: higher s, then lower index)
    v = {j: gamma * s[j] + (1 - gamma) * p[j] for j in cand}
    best = sorted(cand, key=lambda j: (-v[j], -s[j], j))[:k]
    return [rows[j] for j in best], [v[j] for j in best], [s[j] for j in best]


# --------------------------------------------------------------------------- plain top-k
@pytest.mark.parametrize("k", [1, 5, 20])
def test_plain_topk_matches_numpy(store, queries, k):
    r = Retriever(store)
    for tenant in SIZES:
        assert_separated(store, queries, tenant, k)
        res = r.search(queries, tenants=tenant, config=RetrievalConfig(k=k))
        assert isinstance(res, SearchResult) and res.index.shape == (len(queries), k)
        for qi, q in enumerate(queries.numpy()):
            exp_rows, exp_s = ref_topk(store, q, tenant, k)
            got = res.index[qi].tolist()
            assert got[: len(exp_rows)] == exp_rows, (tenant, qi)
            np.testing.assert_allclose(res.similarity[qi, : len(exp_rows)].numpy(), exp_s, atol=1e-5)
            np.testing.assert_allclose(res.score[qi, : len(exp_rows)].numpy(), exp_s, atol=1e-5)
            assert all(store.tenants[j] == tenant for j in got if j >= 0)


def test_never_returns_another_tenants_node(store):
    r = Retriever(store)
    bob = rows_of(store, "bob")
    # queries that ARE bob's vectors: perfect matches, but searched for alice
    q = store.embeddings[bob[:5]]
    res = r.search(q, tenants="alice", config=RetrievalConfig(k=10))
    assert not set(res.index.flatten().tolist()) & set(bob)
    assert all(store.tenants[j] == "alice" for j in res.index.flatten().tolist())
    agpr = r.search(q, tenants="alice", config=RetrievalConfig(k=10, agpr=True))
    assert all(store.tenants[j] == "alice" for j in agpr.index.flatten().tolist())
    # and for bob they come first
    own = r.search(q, tenants="bob", config=RetrievalConfig(k=1))
    assert own.index[:, 0].tolist() == bob[:5]


def test_per_query_tenants(store, queries):
    r = Retriever(store)
    tens = ["alice", "bob", "carol", "dave", "alice", "bob", "carol", "dave", "bob"]
    res = r.search(queries, tenants=tens, config=RetrievalConfig(k=4))
    for qi, (q, t) in enumerate(zip(queries.numpy(), tens)):
        assert_separated(store, queries[qi: qi + 1], t, 4)  # a batch of one may round differently
        exp_rows, _ = ref_topk(store, q, t, 4)
        assert [j for j in res.index[qi].tolist() if j >= 0] == exp_rows
        # same answer as a batch of one
        one = r.search(queries[qi: qi + 1], tenants=t, config=RetrievalConfig(k=4))
        assert torch.equal(one.index[0], res.index[qi])


def test_queries_need_not_be_normalised(store, queries):
    r = Retriever(store)
    for k, agpr in ((8, {}), (8, {"L": 4, "lam": 0.2, "gamma": 0.9})):  # scaled queries normalise differently
        assert_separated(store, queries, "alice", k, **agpr)
    a = r.search(queries, tenants="alice", config=RetrievalConfig(k=8, agpr=True))
    b = r.search(queries * 7.5, tenants="alice", config=RetrievalConfig(k=8, agpr=True))
    assert torch.equal(a.index, b.index)
    torch.testing.assert_close(a.score, b.score)
    c = r.search(queries.double(), tenants="alice", config=RetrievalConfig(k=8))
    assert torch.equal(c.index, r.search(queries, tenants="alice", config=RetrievalConfig(k=8)).index)


def test_default_config(store, queries):
    res = Retriever(store).search(queries, tenants="alice")
    assert res.index.shape == (len(queries), RetrievalConfig().k)


# --------------------------------------------------------------------------- AGPR
@pytest.mark.parametrize("k, L, lam, gamma", [
    (10, 4, 0.2, 0.9),  # the method's defaults (k=10)
    (5, 4, 0.2, 0.5),  # temporal term strong enough to reorder
    (8, 2, 0.5, 0.3),
    (3, 3, 0.0, 0.7),  # lam 0: still one anchor
    (6, 1, 1.0, 0.05),  # almost only propagation
    (12, 4, 0.2, 1.0),  # only similarity counts
])
def test_agpr_matches_plain_python(store, queries, k, L, lam, gamma):
    r = Retriever(store)
    cfg = RetrievalConfig(k=k, agpr=True, L=L, lam=lam, gamma=gamma)
    for tenant in ("alice", "bob", "carol"):
        assert_separated(store, queries, tenant, k, L=L, lam=lam, gamma=gamma)
        res = r.search(queries, tenants=tenant, config=cfg)
        for qi, q in enumerate(queries.numpy()):
            exp_rows, exp_v, exp_s = ref_agpr(store, q, tenant, k, L=L, lam=lam, gamma=gamma)
            got = res.index[qi].tolist()
            assert got[: len(exp_rows)] == exp_rows, (tenant, qi)
            assert all(j == -1 for j in got[len(exp_rows):])
            np.testing.assert_allclose(res.score[qi, : len(exp_rows)].numpy(), exp_v, atol=1e-5)
            np.testing.assert_allclose(res.similarity[qi, : len(exp_rows)].numpy(), exp_s, atol=1e-5)


def test_agpr_exact_ties_go_to_higher_similarity():
    mismatches = []
    for seed in range(5):
        st = make_store(seed=seed)
        q = torch.from_numpy(np.random.default_rng(100 + seed).standard_normal((20, D)).astype(np.float32))
        res = Retriever(st).search(q, tenants="alice", config=RetrievalConfig(k=6, agpr=True, L=1, lam=1.0, gamma=0.0))
        assert_separated(st, q, "alice", 6, L=1, lam=1.0, gamma=0.0)  # equal p values are exact ties
        for qi in range(len(q)):
            exp_rows = ref_agpr(st, q[qi].numpy(), "alice", 6, L=1, lam=1.0, gamma=0.0)[0]
            if res.index[qi].tolist() != exp_rows:
                mismatches.append((seed, qi, res.index[qi].tolist(), exp_rows))
    assert mismatches == []


def test_agpr_changes_the_ranking(store, queries):
    """The temporal term does something: with a low gamma AGPR differs from plain top-k."""
    r = Retriever(store)
    plain = r.search(queries, tenants="alice", config=RetrievalConfig(k=5))
    agpr = r.search(queries, tenants="alice", config=RetrievalConfig(k=5, agpr=True, gamma=0.3))
    assert not torch.equal(plain.index, agpr.index)
    # gamma 1 with the full candidate set: AGPR is plain top-k
    same = r.search(queries, tenants="alice", config=RetrievalConfig(k=5, agpr=True, gamma=1.0))
    assert torch.equal(plain.index, same.index)


def test_agpr_equal_timestamps_share_a_position():
    """All candidates at one time: every p_j = 1, so AGPR ranks by similarity alone."""
    rng = np.random.default_rng(3)
    st = MemoryStore.from_columns(ids=[f"x{i}" for i in range(30)], texts=["t"] * 30, timestamps=[T0] * 30,
                                  embeddings=rng.standard_normal((30, D)).astype(np.float32))
    q = torch.from_numpy(rng.standard_normal((4, D)).astype(np.float32))
    r = Retriever(st)
    plain = r.search(q, config=RetrievalConfig(k=6))
    agpr = r.search(q, config=RetrievalConfig(k=6, agpr=True, gamma=0.2))
    assert torch.equal(plain.index, agpr.index)
    torch.testing.assert_close(agpr.score, 0.2 * plain.similarity + 0.8, atol=1e-6, rtol=0)


# --------------------------------------------------------------------------- small tenants
@pytest.mark.parametrize("agpr", [False, True])
def test_k_larger_than_tenant(store, queries, agpr):
    r = Retriever(store)
    k = 10
    for tenant in ("carol", "dave"):
        n = SIZES[tenant]
        res = r.search(queries, tenants=tenant, config=RetrievalConfig(k=k, agpr=agpr))
        assert res.index.shape == (len(queries), k)
        assert (res.index[:, n:] == -1).all()
        assert torch.isinf(res.score[:, n:]).all() and (res.score[:, n:] < 0).all()
        assert (res.index[:, :n] >= 0).all()
        for qi in range(len(queries)):
            assert sorted(res.index[qi, :n].tolist()) == rows_of(store, tenant)
        hits = res.hits(store)
        assert all(len(h) == n for h in hits)


def test_search_pads_with_fewer_hits(store, queries):
    hits = search(store, queries[:2], k=5, tenant="dave")
    assert [len(h) for h in hits] == [1, 1]
    assert hits[0][0]["id"] == store.ids[rows_of(store, "dave")[0]]


# --------------------------------------------------------------------------- errors
def test_missing_tenant_on_multi_tenant_store(store, queries):
    with pytest.raises(ValueError) as e:
        Retriever(store).search(queries)
    msg = str(e.value)
    assert all(t in msg for t in SIZES)
    with pytest.raises(ValueError):
        search(store, queries)


def test_unknown_tenant(store, queries):
    with pytest.raises(ValueError) as e:
        Retriever(store).search(queries, tenants="eve")
    msg = str(e.value)
    assert "'eve'" in msg and all(t in msg for t in SIZES)
    with pytest.raises(ValueError, match="'eve'"):
        Retriever(store).search(queries[:2], tenants=["alice", "eve"])
    with pytest.raises(ValueError, match="'eve'"):
        search(store, queries, tenant="eve")


def test_tenant_list_length(store, queries):
    with pytest.raises(ValueError, match="one entry per query"):
        Retriever(store).search(queries, tenants=["alice", "bob"])


@pytest.mark.parametrize("shape", [(3, D + 1), (D,), (2, 3, D)])
def test_query_shape(store, shape):
    with pytest.raises(ValueError, match="queries must be"):
        Retriever(store).search(torch.ones(shape), tenants="alice")


def test_text_queries_need_an_embedder(store):
    with pytest.raises(ValueError, match="embedder"):
        search(store, "what did alice buy?", tenant="alice")
    with pytest.raises(ValueError, match="embedder"):
        search(store, ["q1", "q2"], tenant="alice")


# --------------------------------------------------------------------------- search()
def test_search_with_tensor(store, queries):
    hits = search(store, queries, k=3, tenant="bob")
    assert len(hits) == len(queries) and all(len(h) == 3 for h in hits)
    for h, q in zip(hits, queries.numpy()):
        exp_rows, exp_s = ref_topk(store, q, "bob", 3)
        assert [x["id"] for x in h] == [store.ids[j] for j in exp_rows]
        for x, j, s in zip(h, exp_rows, exp_s):
            assert x["text"] == store.texts[j] and x["tenant"] == "bob" and x["sources"] == store.sources[j]
            assert x["timestamp"] == store.timestamps[j].item()
            assert x["similarity"] == pytest.approx(s, abs=1e-5) and x["score"] == x["similarity"]
    # numpy input and an explicit config (which wins over k/agpr)
    h2 = search(store, queries.numpy(), tenant="bob", k=99, config=RetrievalConfig(k=3))
    assert [[x["id"] for x in h] for h in h2] == [[x["id"] for x in h] for h in hits]
    # agpr through search() equals the Retriever
    h3 = search(store, queries, k=4, agpr=True, tenant="alice")
    res = Retriever(store).search(queries, tenants="alice", config=RetrievalConfig(k=4, agpr=True))
    assert [[x["id"] for x in h] for h in h3] == [[store.ids[j] for j in row] for row in res.index.tolist()]


def test_search_single_tenant_store_needs_no_tenant():
    st = make_store(seed=5).select_tenant("alice")
    q = st.embeddings[:2]
    hits = search(st, q, k=1)
    assert [h[0]["id"] for h in hits] == st.ids[:2]


class _FakeEmbedder:
    name = "fake"
    dim = D

    def __init__(self, store):
        self.store = store
        self.calls = []

    def embed(self, texts):
        self.calls.append(list(texts))
        # a text query "memory i" maps to that memory's own vector
        return torch.stack([self.store.embeddings[self.store.texts.index(t)] for t in texts])


def test_search_with_text_and_embedder(store):
    emb = _FakeEmbedder(store)
    j = rows_of(store, "bob")[3]
    hits = search(store, store.texts[j], k=2, tenant="bob", embedder=emb)
    assert emb.calls == [[store.texts[j]]]
    assert len(hits) == 1 and hits[0][0]["id"] == store.ids[j]
    hits = search(store, [store.texts[j], store.texts[j]], k=2, tenant="bob", embedder=emb)
    assert len(hits) == 2 and hits[0] == hits[1]
