"""Helpers of the Mem0 backend tests: one Mem0 config per backend (embedded Qdrant, Chroma
on a folder, Chroma over HTTP, pgvector, FAISS), stores opened with an embedding cache, and
snapshots of a scope (ids, payload text, vectors)."""
import uuid

import numpy as np
from test_mem0_adapter import _config

from memforest_gpu.adapters.mem0.inplace import load_memory
from memforest_gpu.adapters.mem0.vectors import payload_json, provider_of, read_points

BACKENDS = ["qdrant", "chroma", "chroma-http", "pgvector", "faiss"]
SERVER_BACKENDS = ("chroma-http", "pgvector", "pgvector-fields")
_EMBEDDED = {}  # text -> vector: every store embeds the same facts once per session


def backend_config(backend: str, root: str, servers=None, collection: str | None = None) -> dict:
    """Mem0's config for ``backend`` under ``root`` (servers: the ``mem0_servers`` fixture);
    a server backend gets a fresh collection (table) name unless one is given."""
    if backend not in SERVER_BACKENDS:
        cfg = _config(root, backend)
        if collection:
            cfg["vector_store"]["config"]["collection_name"] = collection
        return cfg
    cfg = _config(root, "qdrant")
    name = collection or f"t{uuid.uuid4().hex[:12]}"
    if backend == "chroma-http":
        cfg["vector_store"] = {"provider": "chroma", "config": servers.chroma.config(name)}
    else:
        cfg["vector_store"] = {"provider": "pgvector",
                               "config": servers.postgres.config(name, fields=backend == "pgvector-fields")}
    return cfg


def cached(m):
    """``m`` with its embedder answering repeated texts from a cache (same vectors as before)."""
    model = m.embedding_model
    embed, batch = model.embed, model.embed_batch

    def embed_cached(text, memory_action=None):
        if text not in _EMBEDDED:
            _EMBEDDED[text] = list(embed(text, memory_action))
        return list(_EMBEDDED[text])

    def batch_cached(texts, memory_action="add"):
        miss = [t for t in dict.fromkeys(texts) if t not in _EMBEDDED]
        for t, v in zip(miss, batch(miss, memory_action) if miss else []):
            _EMBEDDED[t] = list(v)
        return [list(_EMBEDDED[t]) for t in texts]

    model.embed, model.embed_batch = embed_cached, batch_cached
    return m


def open_store(cfg: dict, *, create: bool = False):
    return cached(load_memory(cfg, create=create))


def snapshot(m, filters: dict, store=None) -> dict:
    """id -> (payload JSON text, vector); Chroma keeps no key order, so its keys are sorted."""
    canon = provider_of(m) == "chroma"
    return {p.id: (payload_json(p.payload, sort_keys=canon), p.vector) for p in read_points(m, filters, store=store)}


def same(a: dict, b: dict, provider: str) -> bool:
    """Same ids and payload text; vectors equal (embedded Qdrant renormalises its stored
    vectors in place on a search: within 1e-6 there)."""
    assert sorted(a) == sorted(b)
    for i in a:
        assert a[i][0] == b[i][0], i
        if provider == "qdrant":
            np.testing.assert_allclose(a[i][1], b[i][1], rtol=0, atol=1e-6)
        else:
            np.testing.assert_array_equal(a[i][1], b[i][1])
    return True
