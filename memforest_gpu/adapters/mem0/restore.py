"""Put a Mem0 scope back exactly as in a backup written by :func:`.inplace.compress_mem0`."""
from __future__ import annotations

from datetime import UTC, datetime

import numpy as np

from ...timer import StageTimer
from .backup import read_backup, read_backup_header
from .client import entity_store, load_config, load_memory
from .vectors import Point, delete_points, payloads_equal, provider_of, read_points, write_points
from .write import delete_memories, qdrant_local_batch

__all__ = ["restore_mem0", "open_for_restore", "VECTOR_ATOL"]

# Qdrant's local mode renormalises every stored cosine vector in place on each search
# (qdrant_client/local/distances.py), so stored vectors drift by an ulp or so: a vector
# this close to the backed-up one is the same vector.
VECTOR_ATOL = 1e-6


def _same_store(header: dict, provider: str, collection: str) -> None:
    if header["provider"] != provider or header["collection"] != collection:
        raise ValueError(f"backup is of {header['provider']} collection {header['collection']!r}, the config "
                         f"opens {provider} collection {collection!r}: they must be the same")


def open_for_restore(config, backup, *, quiet: bool = False):
    """The Mem0 ``Memory`` a backup goes back into: the config must name the backup's store
    and collection (checked before Mem0 opens anything); a collection that is gone is created."""
    cfg = dict(load_config(config) if not isinstance(config, dict) else config)
    vs = cfg.get("vector_store") or {}
    c = (vs.get("config") or {}) if isinstance(vs, dict) else {}
    _same_store(read_backup_header(backup), vs.get("provider", "qdrant") if isinstance(vs, dict) else vs,
                c.get("collection_name") or "mem0")
    return load_memory(cfg, create=True, quiet=quiet)


def restore_mem0(memory, backup) -> dict:
    """Put the backed-up scope back exactly: memories of the scope that are not in the
    backup are deleted as Mem0's ``delete`` does (its history records it; in batches,
    :func:`.write.delete_memories`), backed-up memories that
    are missing or changed are written back with their ids, vectors and payloads (a
    restored memory also gets an ADD in Mem0's history); the scope's entities in Mem0's
    entity store likewise. Payloads come back byte for byte (Chroma, which keeps no key
    order: key for key); vectors as stored (Qdrant renormalises cosine vectors on write:
    within ``VECTOR_ATOL``).
    Returns counts: removed, restored, rewritten, unchanged (memories), entities; and the
    wall time in ``seconds``."""
    timer = StageTimer()
    header, saved, saved_ents = read_backup(backup)
    provider = provider_of(memory)
    coll = memory.vector_store.collection_name
    _same_store(header, provider, coll)
    scope = header["scope"]
    es = entity_store(memory)
    if es is None and saved_ents:
        es = memory.entity_store  # the backup has entities: bring the entity store back
    counts = _put_back(memory, saved, scope, None, lambda ids: delete_memories(memory, ids), provider)
    db = getattr(memory, "db", None)
    now = datetime.now(UTC).isoformat()
    back = counts.pop("missing")  # Mem0's history: the memory is back (dated now, as Mem0 dates a DELETE)
    if back and db is not None and hasattr(db, "batch_add_history"):
        db.batch_add_history([{"memory_id": p.id, "old_memory": None, "new_memory": p.payload.get("data"),
                               "event": "ADD", "created_at": p.payload.get("created_at"), "updated_at": now,
                               "actor_id": p.payload.get("actor_id"), "role": p.payload.get("role")} for p in back])
    if es is not None:
        ent = _put_back(memory, saved_ents, scope, es, lambda ids: delete_points(memory, ids, store=es), provider)
        ent.pop("missing")
        counts["entities"] = ent
    return {**counts, "scope": scope, "count": len(saved), "seconds": timer.finish()["total"]}


def _put_back(memory, saved: list[Point], scope: dict, store, delete, provider: str) -> dict:
    """Make the points of one collection in ``scope`` equal ``saved``: delete the extra
    ones, write the missing and changed ones, check the payloads."""
    cur = {p.id: p for p in read_points(memory, scope, store=store)}
    keep = {p.id for p in saved}
    removed = [i for i in cur if i not in keep]
    if removed:
        delete(removed)
    missing, changed, same = [], [], 0
    for p in saved:
        c = cur.get(p.id)
        if c is None:
            missing.append(p)
        elif not payloads_equal(c.payload, p.payload, provider) or (c.sparse or None) != (p.sparse or None) \
                or not np.allclose(c.vector, p.vector, rtol=0, atol=VECTOR_ATOL):
            changed.append(p)
        else:
            same += 1
    with qdrant_local_batch(store if store is not None else memory.vector_store):
        write_points(memory, missing + changed, replace={p.id for p in changed}, store=store)
    after = {p.id: p for p in read_points(memory, scope, store=store)}
    bad = [p.id for p in saved if p.id not in after or not payloads_equal(after[p.id].payload, p.payload, provider)]
    if bad or len(after) != len(saved):
        raise RuntimeError(f"restore could not put the scope back: {len(bad)} points differ (first: {bad[:3]}), "
                           f"{len(after)} found, {len(saved)} in the backup")
    return {"removed": len(removed), "restored": len(missing), "rewritten": len(changed), "unchanged": same,
            "missing": missing}
