"""Every search path honours a store's keys (retrieval/keyed.py): the batched torch search
(padded groups and big tenants), AGPR, the faiss indexes, search_file and ``memforest search``.

The core case: a merged node whose text's vector (the embedding of two memories) matches a
question about one of them less than an unrelated node does; its key (that memory's own
vector) finds it first under the blend, and the single text vector alone misses it."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch
from extras import need

from memforest_gpu import compress
from memforest_gpu.config import CompressConfig, MergeConfig, RetrievalConfig
from memforest_gpu.retrieval.index import IndexConfig, IndexedRetriever
from memforest_gpu.retrieval.retriever import Retriever
from memforest_gpu.store.memory_store import MemoryStore
from memforest_gpu.store.merged_keys import derive_keys
from memforest_gpu.store.synthetic import synthetic_store

D = 8


def unit(*xs):
    v = np.zeros(D)
    for i, x in enumerate(xs):
        v[i] = x
    return v / np.linalg.norm(v)


def hidden_memory(text_weight=0.5):
    """A store of one tenant: "m" merged from a (axis 0) and b (axis 1), its text's vector
    their mean; "c" an unrelated node at cosine 0.75 to the question about a (axis 0); plus
    far-away fillers. Returns (store without keys, store with keys, the question)."""
    inp = MemoryStore.from_columns(
        ids=["a", "b", "c"] + [f"f{i}" for i in range(5)], texts=["a", "b", "c"] + ["filler"] * 5,
        timestamps=[float(i) for i in range(8)],
        embeddings=np.stack([unit(1), unit(0, 1), unit(0.75, 0, 0.6614)] + [unit(0, 0, 0, 1, i) for i in range(5)]))
    m_vec = unit(1, 1)  # cos(q, m) = 0.707 < 0.75
    out = MemoryStore.from_columns(
        ids=["m", "c"] + [f"f{i}" for i in range(5)], texts=["a. b.", "c"] + ["filler"] * 5,
        timestamps=[1.0, 2.0] + [float(3 + i) for i in range(5)],
        embeddings=np.stack([m_vec, unit(0.75, 0, 0.6614)] + [unit(0, 0, 0, 1, i) for i in range(5)]),
        sources=[["a", "b"], ["c"]] + [[f"f{i}"] for i in range(5)])
    with_keys = out.take(np.arange(len(out)))
    with_keys.keys = derive_keys(inp, out.sources.arrow, max_keys=2, text_weight=text_weight)
    return out, with_keys, torch.tensor(unit(1), dtype=torch.float32)[None]


def test_a_merged_node_is_found_by_its_source():
    plain, keyed, q = hidden_memory()
    assert plain.ids[Retriever(plain).search(q, config=RetrievalConfig(k=1)).index[0, 0]] == "c"
    res = Retriever(keyed).search(q, config=RetrievalConfig(k=2))
    assert [keyed.ids[i] for i in res.index[0].tolist()] == ["m", "c"]
    assert res.score[0, 0].item() == pytest.approx(0.5 * 0.70710678 + 0.5 * 1.0, abs=1e-6)  # the blend
    agpr = Retriever(keyed).search(q, config=RetrievalConfig(k=2, agpr=True))
    assert keyed.ids[agpr.index[0, 0]] == "m"


def test_text_weight_one_is_todays_rule():
    plain, keyed, q = hidden_memory(text_weight=1.0)
    a = Retriever(plain).search(q, config=RetrievalConfig(k=5))
    b = Retriever(keyed).search(q, config=RetrievalConfig(k=5))
    assert torch.equal(a.index, b.index) and torch.allclose(a.score, b.score)


def reference(store, q, tenant, k):
    """Brute force, one node at a time (float64): the rule of store/keys.py."""
    keys, w = store.keys, store.keys.text_weight
    E, K = store.embeddings.double(), keys.vectors.double()
    scored = []
    for i, t in enumerate(store.tenants):
        if t != tenant:
            continue
        s = float(E[i] @ q.double())
        rows = range(int(keys.offsets[i]), int(keys.offsets[i + 1]))
        if len(rows):
            s = w * s + (1 - w) * max(float(K[r] @ q.double()) for r in rows)
        scored.append((-s, i))
    return [i for _, i in sorted(scored)[:k]]


@pytest.fixture(scope="module")
def compressed():
    st = synthetic_store(700, tenants=6, dim=16, seed=5, device="cpu")
    cfg = CompressConfig(merge=MergeConfig(ratio=0.6, schedule="matching", keys=2, text_weight=0.4, vectors="float32"))
    out = compress(st, cfg, device="cpu").store
    g = torch.Generator().manual_seed(0)
    names = out.tenant_names()
    q = torch.nn.functional.normalize(torch.randn(30, 16, generator=g), dim=1)
    return out, q, [names[i % len(names)] for i in range(30)]


@pytest.mark.parametrize("large, shared", [(4096, 1 << 20), (10, 1 << 20), (4096, 0)])
def test_batched_search_equals_the_reference(compressed, large, shared):
    """Padded groups; every tenant searched as a big one (by its rows; by its queries)."""
    out, q, tenants = compressed
    r = Retriever(out)
    r.large, r.shared = large, shared
    res = r.search(q, tenants=tenants, config=RetrievalConfig(k=7))
    for j in range(len(q)):
        assert res.index[j].tolist() == reference(out, q[j], tenants[j], 7), j


def test_the_rule_moves_the_ranking(compressed):
    """The keys are read: the same store without them ranks differently."""
    out, q, tenants = compressed
    bare = out.take(np.arange(len(out)))
    bare.keys = None
    a = Retriever(out).search(q, tenants=tenants, config=RetrievalConfig(k=7)).index
    b = Retriever(bare).search(q, tenants=tenants, config=RetrievalConfig(k=7)).index
    assert not torch.equal(a, b)


@pytest.mark.parametrize("kind", ["faiss-flat", "faiss-ivf"])
def test_faiss_indexes_find_nodes_by_their_keys(compressed, kind):
    need("faiss")
    out, q, tenants = compressed
    cfg = IndexConfig(kind=kind, ivf_min_nodes=1, nprobe=10_000)  # every list searched: exact
    res = IndexedRetriever(out, cfg).search(q, tenants=tenants, config=RetrievalConfig(k=7))
    for j in range(len(q)):
        assert res.index[j].tolist() == reference(out, q[j], tenants[j], 7), j
    plain, keyed, q1 = hidden_memory()
    hit = IndexedRetriever(keyed, "faiss-flat").search(q1, config=RetrievalConfig(k=1, agpr=True)).index[0, 0]
    assert keyed.ids[hit] == "m"


def test_search_file_and_the_command_line_use_the_keys(tmp_path, monkeypatch, capsys):
    """search_file reads the keys from the file; a question matching a merged memory's source
    finds it first (the text vector alone ranks another node first)."""
    from memforest_gpu import api
    from memforest_gpu.cli.commands import main
    from memforest_gpu.store.io import write_store

    plain, keyed, q = hidden_memory()

    class Embedder:
        name, dim = "toy", D

        def embed(self, texts):
            return q.repeat(len(texts), 1)

    monkeypatch.setattr(api, "load_store_and_embedder", lambda path, **kw: (api.read_store(path), Embedder()))
    for store, first in ((plain, "c"), (keyed, "m")):
        p = tmp_path / f"{first}.parquet"
        write_store(store, p)
        assert api.search_file(p, ["about a"], k=1)[0][0]["id"] == first
    assert main(["search", str(tmp_path / "m.parquet"), "about a", "-k", "1"]) == 0
    assert "a. b." in capsys.readouterr().out


def test_keys_of_a_tenant_without_merges_are_empty(compressed):
    out, q, tenants = compressed
    one = out.select_tenant(out.tenant_names()[0])
    one.keys = one.keys.take(np.arange(len(one)))
    one.keys.offsets[:] = 0  # no node has keys: searched by text as before
    one.keys.vectors = one.keys.vectors[:0]
    one.keys.sources = pa.array([], type=pa.large_list(pa.large_string()))
    bare = one.take(np.arange(len(one)))
    bare.keys = None
    a = Retriever(one).search(q[:3], tenants=one.tenant_names()[0], config=RetrievalConfig(k=5)).index
    b = Retriever(bare).search(q[:3], tenants=one.tenant_names()[0], config=RetrievalConfig(k=5)).index
    assert torch.equal(a, b)
