"""Vector index choice for retrieval: torch (exact), faiss flat and IVF, AGPR on each."""
import numpy as np
import pytest
import torch

from memforest_gpu import MemoryStore, RetrievalConfig, Retriever
from memforest_gpu.index import IndexConfig, IndexedRetriever, build_index, default_nlist
from memforest_gpu.synthetic import synthetic_store

faiss = pytest.importorskip("faiss")


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


@pytest.mark.parametrize("agpr", [False, True])
def test_faiss_flat_equals_torch(store, agpr):
    q, tens = _queries(store, 40, seed=1)
    cfg = RetrievalConfig(k=10, agpr=agpr)
    a = IndexedRetriever(store, "torch").search(q, tenants=tens, config=cfg)
    b = IndexedRetriever(store, "faiss-flat").search(q, tenants=tens, config=cfg)
    assert torch.equal(a.index, b.index)
    torch.testing.assert_close(a.score, b.score, rtol=0, atol=1e-5)
    torch.testing.assert_close(a.similarity, b.similarity, rtol=0, atol=1e-5)


def test_ivf_probing_every_list_equals_torch_with_agpr(store):
    q, tens = _queries(store, 40, seed=2)
    cfg = RetrievalConfig(k=10, agpr=True)
    ivf = IndexedRetriever(store, IndexConfig(kind="faiss-ivf", nlist=16, nprobe=16, ivf_min_nodes=100))
    assert {ix.kind for ix in ivf.indexes.values()} == {"faiss-ivf"}
    a = IndexedRetriever(store, "torch").search(q, tenants=tens, config=cfg)
    b = ivf.search(q, tenants=tens, config=cfg)
    assert torch.equal(a.index, b.index)
    torch.testing.assert_close(a.score, b.score, rtol=0, atol=1e-5)


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
    q, tens = _queries(store, 20, seed=5)
    cfg = RetrievalConfig(k=10, agpr=True)
    a = IndexedRetriever(store, "torch").search(q, tenants=tens, config=cfg)
    for kind in ("torch", "faiss-flat"):
        b = IndexedRetriever(st, kind).search(q.cuda(), tenants=tens, config=cfg)
        assert torch.equal(a.index, b.index.cpu()), kind
