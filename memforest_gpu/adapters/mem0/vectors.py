"""Native access to the vector store behind a Mem0 ``Memory``: read every point of a scope
with its vector, write points back exactly (id, vector, payload), delete points in batches.
Mem0's own ``get_all`` returns no vectors and pages badly, so reads go to the store itself.

Supported: Qdrant (embedded ``path=`` or a server; ``scroll(with_vectors=True)`` paged),
Chroma (embedded persistent ``path=`` or a server, ``host``/``port``; ``collection.get(include=
embeddings)`` paged by ``limit``/``offset``), pgvector (PostgreSQL; a server-side cursor,
:mod:`.vectors_pg`) and FAISS (Mem0's docstore + ``reconstruct``). The Mem0 bookkeeping
around writes (history, entities) is :mod:`.write`'s.

Chroma keeps no key order in a payload (each read may list the keys differently) and
merges metadata on upsert, so a Chroma payload is compared by content
(:func:`payloads_equal`) and a changed point is deleted and added again. pgvector's JSONB
stores keys in its own canonical order, the same on every read.
"""
from __future__ import annotations

import numpy as np

from .points import Point, payload_json
from .vectors_pg import pg_delete, pg_read, pg_read_ids, pg_write

__all__ = ["Point", "STORES", "read_points", "read_ids", "write_points", "delete_points", "provider_of",
           "check_provider", "payloads_equal", "payload_json"]

STORES = ("qdrant", "chroma", "pgvector", "faiss")


def check_provider(p) -> str:
    if p not in STORES:
        raise ValueError(f"vector_store.provider must be one of {list(STORES)} for memforest's Mem0 adapter, "
                         f"got {p!r}")
    return p


def provider_of(memory) -> str:
    return check_provider(memory.config.vector_store.provider)


def payloads_equal(a: dict, b: dict, provider: str) -> bool:
    """Same payload: the same JSON text, key order included; for Chroma (which keeps no key
    order) the same keys and values."""
    if provider == "chroma":
        return a == b and payload_json(a, sort_keys=True) == payload_json(b, sort_keys=True)
    return payload_json(a) == payload_json(b)


def _matches(payload: dict, filters: dict) -> bool:
    return all(payload.get(k) == v for k, v in filters.items())


def read_points(memory, filters: dict, *, store=None, page: int = 512) -> list[Point]:
    """Every point whose payload has all ``filters`` (key == value), with its vector; ``{}``:
    the whole collection. ``store``: another Mem0 vector store of the same provider (the
    entity store); default the memories. Order: Qdrant's and pgvector's id order / FAISS
    insertion order."""
    vs = store if store is not None else memory.vector_store
    provider = provider_of(memory)
    if provider == "qdrant":
        return _qdrant_read(vs, filters, page)
    if provider == "chroma":
        return _chroma_read(vs, filters, page)
    if provider == "pgvector":
        return pg_read(vs, filters, page)
    return _faiss_read(vs, filters)


def read_ids(memory, ids: list[str], *, page: int = 256, store=None) -> dict[str, Point]:
    """The stored points of ``ids`` with their vectors, read back by id in batches of ``page``
    (Qdrant ``retrieve``, Chroma ``get(ids=...)``, pgvector ``id = ANY(...)``, FAISS docstore
    + ``reconstruct``); an id the store does not hold is absent from the result."""
    vs = store if store is not None else memory.vector_store
    provider = provider_of(memory)
    out: dict[str, Point] = {}
    if provider == "faiss":
        where = {str(x): i for i, x in vs.index_to_id.items()}  # the newest position of each id
        for i in ids:
            pos, payload = where.get(str(i)), vs.docstore.get(i)
            if pos is not None and payload is not None:
                out[str(i)] = Point(str(i), np.asarray(vs.index.reconstruct(int(pos)), dtype=np.float32), dict(payload))
        return out
    if provider == "pgvector":
        return pg_read_ids(vs, list(ids), page)
    for lo in range(0, len(ids), page):
        chunk = list(ids[lo:lo + page])
        if provider == "qdrant":
            for r in vs.client.retrieve(collection_name=vs.collection_name, ids=chunk, with_payload=True,
                                        with_vectors=True):
                v = r.vector.get("") if isinstance(r.vector, dict) else r.vector
                out[str(r.id)] = Point(str(r.id), np.asarray(v, dtype=np.float32), dict(r.payload or {}))
        else:
            r = vs.collection.get(ids=chunk, include=["embeddings", "metadatas"])
            for j, i in enumerate(r["ids"]):
                out[str(i)] = Point(str(i), np.asarray(r["embeddings"][j], dtype=np.float32),
                                    dict(r["metadatas"][j] or {}))
    return out


def write_points(memory, points: list[Point], *, replace: set[str] = frozenset(), store=None) -> None:
    """Store ``points`` exactly as given (ids kept). ``replace``: ids already in the store
    (FAISS cannot overwrite in place, so those are deleted first)."""
    if not points:
        return
    vs = store if store is not None else memory.vector_store
    provider = provider_of(memory)
    if provider == "qdrant":
        _qdrant_write(vs, points)
    elif provider == "chroma":
        _chroma_write(vs, points, replace)
    elif provider == "pgvector":
        pg_write(vs, points)
    else:
        _faiss_write(vs, points, replace)


def delete_points(memory, ids: list[str], *, store=None, batch: int = 1024) -> None:
    """Delete the points of ``ids`` from the vector store, ``batch`` per request (FAISS: one
    rebuild of the index for all of them, as Mem0's own delete rebuilds it for one)."""
    ids = [str(i) for i in ids]
    if not ids:
        return
    vs = store if store is not None else memory.vector_store
    provider = provider_of(memory)
    if provider == "faiss":
        _faiss_delete(vs, set(ids))
    elif provider == "pgvector":
        pg_delete(vs, ids, batch)
    else:
        for lo in range(0, len(ids), batch):
            chunk = ids[lo:lo + batch]
            if provider == "qdrant":
                from qdrant_client import models

                vs.client.delete(collection_name=vs.collection_name, points_selector=models.PointIdsList(points=chunk))
            else:
                vs.collection.delete(ids=chunk)


# --------------------------------------------------------------------------- qdrant
def _qdrant_read(vs, filters: dict, page: int) -> list[Point]:
    from qdrant_client import models

    flt = None
    if filters:
        flt = models.Filter(must=[models.FieldCondition(key=k, match=models.MatchValue(value=v))
                                  for k, v in filters.items()])
    out: list[Point] = []
    offset = None
    while True:
        recs, offset = vs.client.scroll(collection_name=vs.collection_name, scroll_filter=flt, limit=page,
                                        offset=offset, with_payload=True, with_vectors=True)
        for r in recs:
            v = r.vector
            sparse = None
            if isinstance(v, dict):
                dense = v.get("")
                sparse = {k: {"indices": list(s.indices), "values": list(s.values)} for k, s in v.items()
                          if k != "" and s is not None} or None
            else:
                dense = v
            if dense is None:
                raise ValueError(f"memory {r.id!s} has no dense vector in collection {vs.collection_name!r}")
            out.append(Point(str(r.id), np.asarray(dense, dtype=np.float32), dict(r.payload or {}), sparse))
        if offset is None:
            return out


def _qdrant_write(vs, points: list[Point]) -> None:
    from qdrant_client import models

    structs = []
    for p in points:
        vec: dict = {"": p.vector.astype(np.float32).tolist()}
        for name, s in (p.sparse or {}).items():
            vec[name] = models.SparseVector(indices=list(s["indices"]), values=list(s["values"]))
        structs.append(models.PointStruct(id=p.id, vector=vec, payload=p.payload))
    for i in range(0, len(structs), 256):
        vs.client.upsert(collection_name=vs.collection_name, points=structs[i:i + 256], wait=True)


# --------------------------------------------------------------------------- chroma
def chroma_where(filters: dict) -> dict | None:
    """Chroma's ``where`` for key == value filters: one clause, or their ``$and``."""
    clauses = [{k: {"$eq": v}} for k, v in filters.items()]
    return None if not clauses else clauses[0] if len(clauses) == 1 else {"$and": clauses}


def _chroma_read(vs, filters: dict, page: int) -> list[Point]:
    out: list[Point] = []
    where = chroma_where(filters)
    while True:
        r = vs.collection.get(where=where, limit=page, offset=len(out), include=["embeddings", "metadatas"])
        ids = r["ids"]
        emb = r["embeddings"]
        for j, i in enumerate(ids):
            if emb is None or emb[j] is None:
                raise ValueError(f"memory {i!s} has no vector in collection {vs.collection_name!r}")
            out.append(Point(str(i), np.asarray(emb[j], dtype=np.float32), dict(r["metadatas"][j] or {})))
        if len(ids) < page:
            return out


def _chroma_write(vs, points: list[Point], replace: set[str]) -> None:
    gone = [p.id for p in points if p.id in replace]
    if gone:  # an upsert would merge the old metadata into the new
        vs.collection.delete(ids=gone)
    for i in range(0, len(points), 256):
        chunk = points[i:i + 256]
        vs.collection.add(ids=[p.id for p in chunk], embeddings=[p.vector.astype(np.float32) for p in chunk],
                          metadatas=[dict(p.payload) for p in chunk])


# --------------------------------------------------------------------------- faiss
def _faiss_read(vs, filters: dict) -> list[Point]:
    if vs.index is None:
        return []
    out = []
    for pos in sorted(vs.index_to_id):
        mid = vs.index_to_id[pos]
        payload = vs.docstore.get(mid)
        if payload is None or not _matches(payload, filters):
            continue
        out.append(Point(str(mid), np.asarray(vs.index.reconstruct(int(pos)), dtype=np.float32), dict(payload)))
    return out


def _faiss_delete(vs, ids: set[str]) -> None:
    """Mem0's FAISS delete (rebuild the index from the vectors kept, renumber, save) for a set."""
    keep = [pos for pos in sorted(vs.index_to_id) if vs.index_to_id[pos] not in ids]
    if len(keep) == len(vs.index_to_id):
        return
    vectors = np.stack([vs.index.reconstruct(int(pos)) for pos in keep]) if keep else None
    names = [vs.index_to_id[pos] for pos in keep]
    vs.index.reset()
    if vectors is not None:
        vs.index.add(vectors.astype(np.float32))
    for i in ids:
        vs.docstore.pop(i, None)
    vs.index_to_id = dict(enumerate(names))
    vs._save()


def _faiss_write(vs, points: list[Point], replace: set[str]) -> None:
    """Mem0's FAISS insert without its re-normalisation: the vectors go in exactly as given."""
    _faiss_delete(vs, {p.id for p in points if p.id in replace})
    start = len(vs.index_to_id)
    vs.index.add(np.stack([p.vector for p in points]).astype(np.float32))
    for j, p in enumerate(points):
        vs.docstore[p.id] = dict(p.payload)
        vs.index_to_id[start + j] = p.id
    vs._save()
