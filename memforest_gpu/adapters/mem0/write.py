"""What Mem0 writes for ``Memory.add(..., infer=False)`` and ``Memory.delete``, for many
memories at once, through Mem0's own storage objects.

Mem0 2.2's ``add(infer=False)`` embeds, inserts and records history one memory at a time,
and its ``delete`` reads the memory, deletes it, records history and rewrites every entity
linked to it (re-embedding the entity) one memory at a time. Here the same rows are written
in batches:

- :func:`add_memories`: the payload ``add`` would store (:func:`add_payload`), inserted with
  ``vector_store.insert`` a batch per call (Qdrant computes its BM25 vectors per batch), and
  Mem0's ADD history rows with ``db.batch_add_history``;
- :func:`delete_memories`: the payloads read back by id in batches (a memory that is gone
  stops the run before anything is deleted, where Mem0's ``delete`` raises), the points
  deleted a batch per request, Mem0's DELETE history rows, then Mem0's entity cleanup once
  for all of them: each entity of a deleted memory's scope loses the deleted ids, and is
  re-embedded and updated, or deleted when no link is left.

Embedded Qdrant (qdrant-client's local mode) commits its SQLite file once per point, each
commit waiting for the disk; during a batch those commits skip the wait (``PRAGMA
synchronous=OFF`` on its connection) and the file is synced once at the end of the batch
(:func:`qdrant_local_batch`). The data written is the same.

What differs from Mem0's own path: generated ids, the ``updated_at`` of DELETE rows (the
time of writing) and the order of rows with equal timestamps; the vector of an added memory
is the one given (memforest embeds merged text with Mem0's embedder, in batches), and a
re-embedded entity is embedded in a batch.
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import logging
import os
import uuid
from datetime import UTC, datetime

import numpy as np

from .vectors import delete_points, read_ids, read_points

__all__ = ["add_payload", "add_memories", "delete_memories", "qdrant_local_batch", "IDENTITY_KEYS"]

log = logging.getLogger("memforest_gpu")

SCOPE_KEYS = ("user_id", "agent_id", "run_id")
IDENTITY_KEYS = (*SCOPE_KEYS, "actor_id")  # keys Mem0 drops from caller metadata on add


def _lemmatize(text: str) -> str:
    from mem0.utils.lemmatization import lemmatize_for_bm25

    return lemmatize_for_bm25(text)


def add_payload(text: str, metadata: dict, scope_ids: dict, role: str, actor_id: str | None = None, *,
                now: str | None = None) -> dict:
    """The payload ``add([{"role": role, "content": text, "name": actor_id}], **scope_ids,
    metadata=metadata, infer=False)`` stores, key order included."""
    meta = {k: v for k, v in copy.deepcopy(metadata).items() if k not in IDENTITY_KEYS}
    for k in SCOPE_KEYS:
        v = scope_ids.get(k)
        if v is not None and str(v).strip():
            meta[k] = str(v).strip()
    meta["role"] = role
    if actor_id:
        meta["actor_id"] = actor_id
    meta["data"] = text
    meta["hash"] = hashlib.md5(text.encode()).hexdigest()
    if "created_at" not in meta:
        meta["created_at"] = now or datetime.now(UTC).isoformat()
    meta["updated_at"] = meta["created_at"]
    meta["text_lemmatized"] = _lemmatize(text)
    return meta


def add_memories(memory, vectors: list[np.ndarray], payloads: list[dict], *, batch: int = 256) -> list[str]:
    """Insert memories with the payloads of :func:`add_payload` and record Mem0's ADD history;
    returns their new ids. Each batch is inserted, then its history written."""
    ids = [str(uuid.uuid4()) for _ in payloads]
    for lo in range(0, len(ids), batch):
        chunk = slice(lo, lo + batch)
        with qdrant_local_batch(memory.vector_store):
            memory.vector_store.insert(vectors=[np.asarray(v, dtype=np.float32).tolist() for v in vectors[chunk]],
                                       ids=ids[chunk], payloads=payloads[chunk])
        memory.db.batch_add_history([
            {"memory_id": i, "old_memory": None, "new_memory": p["data"], "event": "ADD",
             "created_at": p.get("created_at"), "updated_at": p.get("updated_at"), "actor_id": p.get("actor_id"),
             "role": p.get("role")} for i, p in zip(ids[chunk], payloads[chunk])])
    return ids


@contextlib.contextmanager
def qdrant_local_batch(vs):
    """For a collection of embedded Qdrant: its SQLite commits do not wait for the disk in the
    block, and the file is synced once when the block ends (with the setting restored). Any
    other store: nothing."""
    coll = getattr(getattr(getattr(vs, "client", None), "_client", None), "collections", {}).get(
        getattr(vs, "collection_name", None)) if getattr(vs, "is_local", False) else None
    persistence = getattr(coll, "storage", None)
    conn = getattr(persistence, "storage", None)
    if conn is None or not hasattr(conn, "execute"):
        yield
        return
    was = conn.execute("PRAGMA synchronous").fetchone()[0]
    conn.execute("PRAGMA synchronous=OFF")
    try:
        yield
    finally:
        conn.execute(f"PRAGMA synchronous={int(was)}")
        fd = os.open(persistence.location, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _utc(ts):
    """Mem0's DELETE rows: an aware ISO timestamp in UTC, anything else as it is."""
    if not ts:
        return ts
    try:
        t = datetime.fromisoformat(ts)
    except (TypeError, ValueError):
        return ts
    return ts if t.tzinfo is None else t.astimezone(UTC).isoformat()


def delete_memories(memory, ids: list[str], *, batch: int = 1024) -> None:
    """Delete ``ids`` as Mem0's ``delete`` does, in batches (see the module docstring)."""
    ids = list(dict.fromkeys(str(i) for i in ids))
    scopes: dict[str, dict] = {}
    for lo in range(0, len(ids), batch):
        chunk = ids[lo:lo + batch]
        got = read_ids(memory, chunk)
        gone = [i for i in chunk if i not in got]
        if gone:
            raise ValueError(f"Memory with id {gone[0]} not found ({len(gone)} of {len(chunk)} in this batch); "
                             "nothing of this batch was deleted")
        with qdrant_local_batch(memory.vector_store):
            delete_points(memory, chunk)
        now = datetime.now(UTC).isoformat()
        rows = []
        for i in chunk:
            p = got[i].payload
            scopes[i] = {k: p[k] for k in SCOPE_KEYS if p.get(k)}
            rows.append({"memory_id": i, "old_memory": p.get("data", ""), "new_memory": None, "event": "DELETE",
                         "created_at": _utc(p.get("created_at")), "updated_at": now, "is_deleted": 1,
                         "actor_id": p.get("actor_id"), "role": p.get("role")})
        memory.db.batch_add_history(rows)
    if getattr(memory, "_entity_store", None) is not None and scopes:  # Mem0 cleans entities only once opened
        _unlink_entities(memory, memory._entity_store, scopes)


def _unlink_entities(memory, es, scopes: dict[str, dict]) -> None:
    """Mem0's entity cleanup for every deleted memory: an entity matching the memory's scope
    loses its id; left with no link it is deleted, else re-embedded and updated."""
    first = next(iter(scopes.values()))
    common = {k: v for k, v in first.items() if all(s.get(k) == v for s in scopes.values())}
    changed = []
    for e in read_points(memory, common, store=es):
        linked = e.payload.get("linked_memory_ids")
        if not isinstance(linked, list):
            continue
        remaining = [m for m in linked
                     if not (m in scopes and all(e.payload.get(k) == v for k, v in scopes[m].items()))]
        if len(remaining) == len(linked):
            continue
        text = e.payload.get("data")
        if not remaining and (isinstance(text, str) and text or len(set(linked)) == 1):
            _quietly(es.delete, vector_id=e.id)
        elif isinstance(text, str) and text:  # Mem0 skips an entity without text
            changed.append((e, remaining))
    if not changed:
        return
    texts = [e.payload["data"] for e, _ in changed]
    batch = getattr(memory.embedding_model, "embed_batch", None)
    vecs = batch(texts, "update") if batch is not None else [memory.embedding_model.embed(t, "update") for t in texts]
    for (e, remaining), vec in zip(changed, vecs):
        _quietly(es.update, vector_id=e.id, vector=list(vec), payload={**e.payload, "linked_memory_ids": remaining})


def _quietly(fn, **kw) -> None:
    """Entity cleanup never fails a delete (as in Mem0): a failure is logged."""
    try:
        fn(**kw)
    except Exception as e:  # noqa: BLE001 - Mem0 swallows entity-store errors here too
        log.warning("entity cleanup failed for %s: %s", kw.get("vector_id"), e)
