"""Vector index choice for retrieval: torch (exact), faiss flat and IVF, AGPR on each."""
import numpy as np
import pytest
import torch
from extras import need
from margins import assert_enough, dot_tolerance, retrieval_margins, sorted_gaps

from memforest_gpu import MemoryStore, RetrievalConfig, Retriever
from memforest_gpu.retrieval.index import IndexConfig, IndexedRetriever, build_index, default_nlist
from memforest_gpu.store.synthetic import synthetic_store

faiss = need("faiss")


def _queries(store, q, seed=0, noise=0.3):
    """Noisy copies of random store rows, so the neighbours are known to exist."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, len(store), (q,), generator=g)
    e = store.embeddings[rows] + noise * torch.randn(q, store.dim, generator=g) / store.dim ** 0.5
    return torch.nn.functional.normalize(e, dim=1), [store.tenants[i] for i in rows.tolist()]


@pytest.fixture(scope="module")
def store():
    return synthetic_store(3000, tenants=2, dim=48, seed=4, big_tenant_share=0.8)


def test_torch_index_equals_retriever(store):
    q, tens = _queries(store, 40)
    for agpr in (False, True):
        cfg = RetrievalConfig(k=10, agpr=agpr)
        a = Retriever(store).search(q, tenants=tens, config=cfg)
        b = IndexedRetriever(store, "torch").search(q, tenants=tens, config=cfg)
        assert torch.equal(a.index, b.index)
        assert torch.equal(a.score, b.score)


def _margins(store, q, tens, cfg):
    """Per query, the float64 gap deciding its result (:func:`margins.retrieval_margins`)."""
    rows = {t: np.flatnonzero(np.asarray(store.tenants) == t) for t in set(tens)}
    return retrieval_margins(store.embeddings, store.timestamps, [rows[t] for t in tens], q, k=cfg.k,
                             agpr=cfg.agpr, L=cfg.L, lam=cfg.lam, gamma=cfg.gamma)


def _agrees_with_torch(store, other: IndexedRetriever, seed: int, n_queries: int = 200):
    """``other`` (a faiss index, or a store on another device) against the exact torch search
    on the CPU, robust to BLAS rounding.

    Continuous part, every query: the sorted similarities of the plain top-k and of the
    AGPR candidate pool (the plain top L*k) agree within the float32 rounding bound.
    Discrete part: rows and scores agree exactly (scores within the bound) on the queries
    whose deciding gaps exceed that bound; at least half of the 200 queries are such (the
    faiss and torch matmuls round differently, so a near-tie at a cut may fall either way:
    that is a correct answer, not a disagreement). Elsewhere, every row faiss returns must
    be one the exact search could return: its float64 similarity is within the bound of the
    k-th best.
    """
    q, tens = _queries(store, n_queries, seed=seed)
    tol = dot_tolerance(store.dim)
    torch_r = IndexedRetriever(store, "torch")
    for cfg in (RetrievalConfig(k=10), RetrievalConfig(k=40), RetrievalConfig(k=10, agpr=True)):
        a = torch_r.search(q, tenants=tens, config=cfg)
        b = other.search(q.to(other.store.device), tenants=tens, config=cfg)
        b = type(b)(b.index.cpu(), b.score.cpu(), b.similarity.cpu())
        assert a.index.shape == b.index.shape == (len(q), cfg.k)
        if not cfg.agpr:  # the similarity of the i-th best is continuous in the inputs
            torch.testing.assert_close(a.similarity, b.similarity, rtol=0, atol=tol)
        ok = torch.from_numpy(_margins(store, q, tens, cfg) > tol)
        assert_enough(ok.numpy(), n_queries // 2, f"queries (k={cfg.k}, agpr={cfg.agpr})")
        assert torch.equal(a.index[ok], b.index[ok]), cfg
        torch.testing.assert_close(a.score[ok], b.score[ok], rtol=0, atol=tol)
        torch.testing.assert_close(a.similarity[ok], b.similarity[ok], rtol=0, atol=tol)
        if not cfg.agpr:  # near-tie queries: each row returned is a valid member of the top k
            exact = store.embeddings.double() @ torch.nn.functional.normalize(q.double(), dim=1).T  # (N, Q)
            kth = a.similarity[:, -1].double()
            got = exact.gather(0, b.index.clamp(min=0).T).T  # (Q, k)
            assert bool((b.index >= 0).all()) and bool((got >= kth[:, None] - tol).all())


def test_faiss_flat_equals_torch(store):
    _agrees_with_torch(store, IndexedRetriever(store, "faiss-flat"), seed=1)


def test_ivf_probing_every_list_equals_torch_with_agpr(store):
    ivf = IndexedRetriever(store, IndexConfig(kind="faiss-ivf", nlist=16, nprobe=16, ivf_min_nodes=100))
    assert {ix.kind for ix in ivf.indexes.values()} == {"faiss-ivf"}
    _agrees_with_torch(store, ivf, seed=2)


def test_ivf_recall_against_exact(store):
    big = store.select_tenant(store.tenant_names()[0])  # 2400 nodes
    q, _ = _queries(big, 200, seed=3, noise=1.0)
    k = 10
    _, exact = build_index(big.embeddings, "torch").search(q, k)
    recalls = {}
    for nprobe in (1, 8, 32):
        ix = build_index(big.embeddings, IndexConfig(kind="faiss-ivf", nprobe=nprobe))
        assert ix.nlist == default_nlist(len(big)) == 61
        _, got = ix.search(q, k)
        hit = [len(set(g.tolist()) & set(e.tolist())) / k for g, e in zip(got, exact)]
        recalls[nprobe] = float(np.mean(hit))
    assert recalls[1] < recalls[8] <= recalls[32], recalls  # approximate, better with more probes
    assert recalls[1] < 0.9 and recalls[8] >= 0.9 and recalls[32] >= 0.99, recalls


def test_small_tenants_get_a_flat_index():
    st = synthetic_store(300, tenants=3, dim=16, seed=1)
    r = IndexedRetriever(st, IndexConfig(kind="faiss-ivf"))  # ivf_min_nodes=1000
    assert {ix.kind for ix in r.indexes.values()} == {"faiss-flat"}


def test_fewer_nodes_than_candidates():
    st = MemoryStore.from_columns(ids=["a", "b", "c"], texts=["x", "y", "z"], timestamps=[1, 2, 3],
                                  embeddings=torch.eye(3))
    cfg = RetrievalConfig(k=2, agpr=True)  # L*k = 8 candidates wanted, 3 exist
    q = torch.tensor([[1.0, 0.1, 0.0]])
    a = Retriever(st).search(q, config=cfg)
    for kind in ("faiss-flat", "faiss-ivf"):
        b = IndexedRetriever(st, IndexConfig(kind=kind, ivf_min_nodes=1, nlist=2, nprobe=2)).search(q, config=cfg)
        assert torch.equal(a.index, b.index), kind


def test_bad_options():
    with pytest.raises(ValueError, match=r"index must be one of \['torch', 'faiss-flat', 'faiss-ivf'\], got 'hnsw'"):
        IndexConfig(kind="hnsw")
    with pytest.raises(ValueError, match="nprobe must be an integer >= 1, got 0"):
        IndexConfig(kind="faiss-ivf", nprobe=0)
    with pytest.raises(ValueError, match="nlist must be"):
        IndexConfig(kind="faiss-ivf", nlist=0)


def test_gpu_without_faiss_gpu_is_refused(store):
    if hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
        pytest.skip("this machine has faiss-gpu")
    with pytest.raises(ValueError, match="gpu must be False or None"):
        build_index(store.embeddings[:50], IndexConfig(kind="faiss-flat", gpu=True))


def test_missing_faiss_names_the_install(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_faiss(name, *a, **kw):
        if name == "faiss":
            raise ImportError("no faiss")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_faiss)
    with pytest.raises(ImportError, match="pip install faiss-cpu"):
        build_index(torch.eye(4), "faiss-flat")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_store(store):
    st = store.to("cuda")
    for kind in ("torch", "faiss-flat"):
        _agrees_with_torch(store, IndexedRetriever(st, kind), seed=5)


def test_search_makes_no_host_round_trip(store):
    """Queries go to faiss as torch tensors and the results come back as tensors: no numpy,
    no .cpu(), no .tolist() per search (on the GPU this is what keeps a search on the device)."""
    from host_reads import count_host_reads

    q, _ = _queries(store, 30, seed=6)
    big = store.select_tenant(store.tenant_names()[0])
    for cfg in (IndexConfig(kind="faiss-flat"), IndexConfig(kind="faiss-ivf", nlist=16, nprobe=4, ivf_min_nodes=100)):
        ix = build_index(big.embeddings, cfg)
        seen = []
        real = ix.index.search
        ix.index.search = lambda x, k: seen.append(type(x)) or real(x, k)
        with count_host_reads() as reads:
            sims, idx = ix.search(q, 10)
        assert reads.total == 0, dict(reads.by_name)
        assert seen == [torch.Tensor] and isinstance(sims, torch.Tensor) and idx.dtype == torch.int64
        _, exact = build_index(big.embeddings, "torch").search(q, 10)
        if cfg.kind == "faiss-flat":  # the same rows where the top 10 is decided by more than rounding
            ok = torch.from_numpy(sorted_gaps((q.double() @ big.embeddings.double().T).numpy(), 10)
                                  > dot_tolerance(store.dim))
            assert_enough(ok.numpy(), 15, "queries")
            assert torch.equal(idx[ok], exact[ok])


def test_gpu_indexes_share_one_gpu_resources_object(monkeypatch):
    """Every tenant's GPU index uses the process's one StandardGpuResources (each such object
    reserves its own scratch memory); stand-in faiss GPU calls, so this runs on any machine."""
    import memforest_gpu.retrieval.index as index_mod

    made, cloned = [], []

    class Res:
        def __init__(self):
            made.append(self)

    monkeypatch.setattr(faiss, "StandardGpuResources", Res, raising=False)
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 1)
    monkeypatch.setattr(faiss, "index_cpu_to_gpu", lambda res, dev, ix: cloned.append((res, dev)) or ix,
                        raising=False)
    monkeypatch.setattr(index_mod, "_GPU_RES", {})
    st = synthetic_store(600, tenants=3, dim=16, seed=2)
    r = IndexedRetriever(st, IndexConfig(kind="faiss-flat", gpu=True))
    assert len(r.indexes) == 3 and len(made) == 1
    assert [c[0] for c in cloned] == [made[0]] * 3 and {c[1] for c in cloned} == {0}
    assert {ix.kind for ix in r.indexes.values()} == {"faiss-flat-gpu"}
    assert index_mod.gpu_resources(0)[0] is made[0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or not hasattr(faiss, "StandardGpuResources"),
                    reason="needs CUDA and faiss-gpu")
def test_faiss_gpu_search_stays_on_the_device(store):
    from host_reads import count_host_reads

    from memforest_gpu.retrieval.index import gpu_resources

    st = store.to("cuda")
    r = IndexedRetriever(st, IndexConfig(kind="faiss-flat"))
    assert {ix.kind for ix in r.indexes.values()} == {"faiss-flat-gpu"}
    q, tens = _queries(store, 20, seed=7)
    ix = r.indexes[tens[0]]
    with count_host_reads() as reads:
        sims, idx = ix.search(q.cuda(), 10)
    assert reads.total == 0 and sims.is_cuda and idx.is_cuda
    assert gpu_resources(0)[0] is not None
