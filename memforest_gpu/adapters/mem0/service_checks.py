"""Checks on a Mem0 store before memforest changes it, each failing with one clear line.

:func:`preflight` runs on Mem0's config before Mem0 opens anything (Mem0 creates a missing
collection or table, and its history database, as it opens them): the server answers and
accepts the login (pgvector, Chroma over HTTP, a Qdrant server), the collection or table
exists (not when ``create``), and the vector dimension the config states is the store's.
Once Mem0 is open, :func:`check_dims` compares the store's dimension with the vectors of
Mem0's embedder (opening an existing store writes nothing to it).
"""
from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from .vectors import check_provider, provider_of
from .vectors_pg import pg_table_dim

__all__ = ["preflight", "collections", "check_dims", "given_dims", "store_dim", "one_line", "chroma_client",
           "pg_dsn"]

TIMEOUT_S = 5


def one_line(e) -> str:
    return " ".join(str(e).split())


def collections(cfg: dict, *, create: bool = False) -> tuple | None:
    """(collection named by Mem0 config ``cfg``, where the store is, the collections there,
    the dimension of that collection's vectors or None); None where that is not checked (a
    client object given, Chroma Cloud, or ``create`` for a store on disk). Raises
    ``ValueError`` (one line) when the server cannot be reached or refuses the login."""
    vs = cfg.get("vector_store") or {}
    provider = check_provider(vs.get("provider", "qdrant"))
    c = dict(vs.get("config") or {})
    coll = c.get("collection_name") or "mem0"  # Mem0's default for every store
    found = {"qdrant": _qdrant, "chroma": _chroma, "pgvector": _pgvector, "faiss": _faiss}[provider](c, coll, create)
    return None if found is None else (coll, *found)


def preflight(cfg: dict, *, create: bool = False) -> None:
    """Raise ``ValueError`` (one line) when the store of Mem0 config ``cfg`` cannot be reached,
    refuses the login, (unless ``create``) lacks the collection, or holds vectors of another
    dimension than the config states."""
    found = collections(cfg, create=create)
    if found is None:
        return
    coll, where, names, dim = found
    if coll not in names:
        if create:
            return
        raise ValueError(f"vector_store.config.collection_name must name an existing collection of {where}, got "
                         f"{coll!r} (there: {', '.join(sorted(names)) or 'none'})")
    check_dims(cfg["vector_store"].get("provider", "qdrant"), coll, dim, given_dims(cfg))


def given_dims(cfg: dict) -> dict:
    """The vector dimensions a Mem0 config states itself (Mem0's defaults are not checked)."""
    out = {}
    for section, key in (("vector_store", "embedding_model_dims"), ("embedder", "embedding_dims")):
        c = (cfg.get(section) or {}).get("config") or {}
        if isinstance(c, dict) and c.get(key) is not None:
            out[f"{section}.config.{key}"] = c[key]
    return out


def check_dims(provider: str, collection: str, stored: int | None, given: dict) -> None:
    """``given``: what -> dimension (config fields, the embedder's vectors); each must equal
    ``stored``, the dimension of the vectors in the store (None: unknown, not checked)."""
    if stored is None:
        return
    for what, d in given.items():
        if d is not None and int(d) != int(stored):
            raise ValueError(f"{what} must be {stored} (the dimension of the vectors in {provider} collection "
                             f"{collection!r}), got {d!r}")


def _size(vectors) -> int | None:
    """Qdrant's vectors config (one unnamed vector, or named ones) -> the dense dimension."""
    if isinstance(vectors, dict) and "size" not in vectors:
        vectors = vectors.get("", next(iter(vectors.values()), None))
    if vectors is None:
        return None
    return int(vectors["size"] if isinstance(vectors, dict) else vectors.size)


def _qdrant(c: dict, coll: str, create: bool):
    if c.get("client") is not None:
        return None
    if c.get("url") or (c.get("host") and c.get("port")):
        from qdrant_client import QdrantClient

        params = {k: c[k] for k in ("url", "api_key", "https") if c.get(k) is not None}
        if c.get("host") and c.get("port"):
            params.update(host=c["host"], port=c["port"])
        where = f"the Qdrant server at {c.get('url') or str(c['host']) + ':' + str(c['port'])}"
        client = QdrantClient(**params, timeout=TIMEOUT_S, check_compatibility=False)
        try:
            names = [x.name for x in client.get_collections().collections]
            dim = _size(client.get_collection(coll).config.params.vectors) if coll in names else None
        except Exception as e:  # noqa: BLE001 - httpx / grpc raise many types
            raise ValueError(f"cannot reach {where}: {one_line(e)}") from None
        finally:
            client.close()
        return where, names, dim
    path = c.get("path") or "/tmp/qdrant"  # Mem0's default
    meta = os.path.join(path, "meta.json")
    if create:
        return None
    if not os.path.exists(meta):
        raise ValueError(f"vector_store.config.path must be an embedded Qdrant folder (with meta.json), got {path!r}")
    with open(meta, encoding="utf-8") as f:
        colls = json.load(f).get("collections", {})
    return f"the embedded Qdrant folder {path}", list(colls), _size(colls[coll]["vectors"]) if coll in colls else None


def chroma_client(c: dict):
    """A Chroma client with the settings Mem0's Chroma store builds from ``c`` (Chroma shares
    one client per settings in a process, so the two never clash)."""
    import chromadb
    from chromadb.config import Settings

    settings = Settings(anonymized_telemetry=False)
    if c.get("host") and c.get("port"):
        settings.chroma_server_host = c["host"]
        settings.chroma_server_http_port = c["port"]
        settings.chroma_api_impl = "chromadb.api.fastapi.FastAPI"
    settings.persist_directory = c.get("path") or "/tmp/chroma"  # Mem0's default path
    settings.is_persistent = True
    return chromadb.Client(settings)


def _chroma(c: dict, coll: str, create: bool):
    if c.get("client") is not None or (c.get("api_key") and c.get("tenant")):
        return None
    if c.get("host") and c.get("port"):
        url = f"http://{c['host']}:{c['port']}"
        try:
            with urllib.request.urlopen(f"{url}/api/v2/heartbeat", timeout=TIMEOUT_S) as r:
                r.read()
        except (OSError, urllib.error.URLError) as e:
            raise ValueError(f"cannot reach the Chroma server at {url} (vector_store.config host/port): "
                             f"{one_line(getattr(e, 'reason', e))}") from None
        where = f"the Chroma server at {url}"
    else:
        path = c.get("path") or "/tmp/chroma"
        if create:
            return None
        if not os.path.exists(os.path.join(path, "chroma.sqlite3")):
            raise ValueError(f"vector_store.config.path must be a Chroma folder (with chroma.sqlite3), got {path!r}")
        where = f"the Chroma folder {path}"
    client = chroma_client(c)
    names = [getattr(x, "name", x) for x in client.list_collections()]
    dim = None
    if coll in names:
        r = client.get_collection(coll).get(limit=1, include=["embeddings"])
        dim = len(r["embeddings"][0]) if r["ids"] else None
    return where, names, dim


def pg_dsn(c: dict) -> str:
    """The connection string Mem0's pgvector store builds from its config."""
    if c.get("connection_string"):
        dsn = c["connection_string"]
    else:
        dsn = (f"postgresql://{c.get('user')}:{c.get('password')}@{c.get('host')}:{c.get('port')}/"
               f"{c.get('dbname', 'postgres')}")
    if c.get("sslmode"):
        from mem0.vector_stores.pgvector import _with_sslmode

        dsn = _with_sslmode(dsn, c["sslmode"])
    return dsn


def _redacted(dsn: str) -> str:
    if "://" not in dsn:
        return " ".join(w for w in dsn.split() if not w.startswith("password="))
    u = urlsplit(dsn)
    if u.password:
        u = u._replace(netloc=u.netloc.replace(":" + u.password + "@", ":***@"))
    return u.geturl()


def _pg_connect(dsn: str):
    try:
        from mem0.vector_stores import pgvector as mem0_pg
    except ImportError:
        raise ImportError("the pgvector store needs psycopg2: pip install 'memforest-gpu[mem0]'") from None
    if mem0_pg.PSYCOPG_VERSION == 3:
        import psycopg

        return psycopg.connect(dsn, connect_timeout=TIMEOUT_S)
    import psycopg2

    return psycopg2.connect(dsn, connect_timeout=TIMEOUT_S)


def _pgvector(c: dict, coll: str, create: bool):
    if c.get("connection_pool") is not None:
        return None
    login, server = c.get("user") or c.get("password"), c.get("host") or c.get("port")
    if not c.get("connection_string") and not (login and server):
        raise ValueError("vector_store.config must give a connection_string, or host/port and user/password (Mem0's "
                         f"pgvector config), got {sorted(k for k in c if k != 'password')}")
    dsn = pg_dsn(c)
    where = f"PostgreSQL at {_redacted(dsn)}"
    try:
        conn = _pg_connect(dsn)
    except ImportError:
        raise
    except Exception as e:  # noqa: BLE001 - the driver's OperationalError and friends
        raise ValueError(f"cannot connect to {where} (vector_store.config): {one_line(e)}") from None
    try:
        with conn.cursor() as cur:
            _, dim, names = pg_table_dim(cur, coll)
    finally:
        conn.close()
    return where, names, dim


def _faiss(c: dict, coll: str, create: bool):
    path = c.get("path") or "/tmp/faiss"  # Mem0's default
    if create:
        return None
    if not os.path.isdir(path):
        raise ValueError(f"vector_store.config.path must be the folder of a FAISS store, got {path!r}")
    names = [f[:-len(".faiss")] for f in os.listdir(path) if f.endswith(".faiss")]
    dim = None
    if coll in names:
        import faiss

        dim = int(faiss.read_index(os.path.join(path, f"{coll}.faiss")).d)
    return f"the FAISS folder {path}", names, dim


def store_dim(memory) -> int | None:
    """The dimension of the vectors an open store holds (None: an empty Chroma collection)."""
    vs = memory.vector_store
    provider = provider_of(memory)
    if provider == "qdrant":
        return _size(vs.client.get_collection(vs.collection_name).config.params.vectors)
    if provider == "chroma":
        r = vs.collection.get(limit=1, include=["embeddings"])
        return len(r["embeddings"][0]) if r["ids"] else None
    if provider == "pgvector":
        with vs._get_cursor() as cur:
            return pg_table_dim(cur, vs.collection_name)[1]
    return int(vs.index.d) if vs.index is not None else None
