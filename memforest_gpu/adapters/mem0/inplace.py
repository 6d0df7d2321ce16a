"""Compress a Mem0 memory store in place, safely, and put it back from a backup.

    memory = load_memory("mem0.yaml")                  # Mem0's own config, as YAML or JSON
    res = compress_mem0(memory, Scope(user_id="alice"), CompressConfig(), backup="alice.parquet")
    restore_mem0(memory, "alice.parquet")             # the scope exactly as before

What :func:`compress_mem0` does, in order:

1. reads every memory of the scope with its vector from the vector store itself
   (:mod:`.vectors`: Qdrant scroll, Chroma paged get, a pgvector server-side cursor, FAISS
   reconstruct);
2. compresses them with MemForest (one vector per memory, :func:`single_vector`: the preset's
   blend of a merged memory's text vector and its sources' centre).
   Tenants are Mem0 scopes: memories with different
   ``user_id`` / ``agent_id`` / ``run_id`` (or ``actor_id``) never merge. Merged text is
   embedded with Mem0's own embedder. Memories with an ``expiration_date`` and procedural
   memories are left as they are;
3. (dry run: stops here and returns the plan)
4. writes a backup of the whole scope (Parquet: ids, vectors, payloads; :mod:`.backup`);
5. adds every merged memory as Mem0's ``add(..., infer=False)`` does (payload, vector, an
   ADD row in Mem0's history), in batches through Mem0's own vector store and history
   objects (:mod:`.write`; ``write_path="mem0"``: through ``Memory.add`` itself, one
   at a time), with ``metadata.merged_from`` = the original ids, the newest original's
   ``created_at``, the scope ids, the shared ``actor_id``/``role`` and the other metadata of
   its originals (newer wins);
6. checks that every merged memory is stored as written, reading the added points back
   from the vector store by id in batches (text, scope ids, vector), and links it to every
   entity of Mem0's entity store that one of its originals links to;
7. only then deletes the memories they replace as Mem0's ``delete`` does, in batches
   (``write_path="mem0"``: ``Memory.delete`` one at a time): history DELETE rows, and they
   are unlinked from their entities, which keep the merged memory.

A failure before step 7 leaves every original in place (plus, possibly, some merged
memories); :func:`restore_mem0` then removes those and the store is as before.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

from ...config import CompressConfig
from ...engine import CompressReport, compress
from ...store.memory_store import MemoryStore
from ...store.timeutil import parse_timestamp
from ...timer import StageTimer
from .backup import write_backup
from .client import Mem0Embedder, check_dimension, close_memory, entity_store, load_config, load_memory
from .plan_text import format_plan
from .restore import restore_mem0
from .vectors import Point, provider_of, read_ids, read_points
from .write import add_memories, add_payload, delete_memories

__all__ = ["Scope", "compress_mem0", "restore_mem0", "format_plan", "MergeGroup", "Mem0CompressResult", "tenant_of",
           "default_backup_path", "load_config", "load_memory", "close_memory", "entity_store", "Mem0Embedder",
           "split_eligible", "merge_groups", "write_back", "store_of_points", "WRITE_PATHS", "check_write_path",
           "single_vector"]

log = logging.getLogger("memforest_gpu")

SCOPE_KEYS = ("user_id", "agent_id", "run_id")
# payload keys Mem0 manages itself; the rest is the caller's metadata and is carried over
_RESERVED = {"data", "hash", "created_at", "updated_at", "text_lemmatized", *SCOPE_KEYS, "actor_id", "role",
             "merged_from", "merged_by", "expiration_date", "memory_type"}
# how merged memories are added and originals deleted: Mem0's writes in batches, or Mem0's
# own add(infer=False) / delete one memory at a time (the reference)
WRITE_PATHS = ("batch", "mem0")


def check_write_path(write_path: str, config: CompressConfig | None = None) -> str:
    """``write_path`` checked, and with ``"mem0"`` the vector it can write: ``Memory.add``
    embeds a merged memory's text itself, so that path writes the text's vector alone
    (``merge.keys`` 0), never the preset's blend."""
    if write_path not in WRITE_PATHS:
        raise ValueError(f"write_path must be one of {list(WRITE_PATHS)}, got {write_path!r}")
    keys = (config or CompressConfig()).merge.keys
    if write_path == "mem0" and keys != 0:
        raise ValueError(f"write_path 'mem0' adds through Memory.add, which embeds the merged text itself: it writes "
                         f"the text's vector only, so it needs keys 0 (--keys 0), got keys {keys}; the 'batch' path "
                         "writes the one-vector blend")
    return write_path


@dataclass(frozen=True, kw_only=True)
class Scope:
    """Which memories: those with all the given ids, or ``all_tenants`` (the whole collection)."""

    user_id: str | None = None
    agent_id: str | None = None
    run_id: str | None = None
    all_tenants: bool = False

    def __post_init__(self):
        ids = {k: getattr(self, k) for k in SCOPE_KEYS if getattr(self, k) is not None}
        for k, v in ids.items():
            if not isinstance(v, str) or not v.strip():
                raise ValueError(f"{k} must be a non-empty string, got {v!r}")
        if self.all_tenants and ids:
            raise ValueError(f"scope must be either ids or all_tenants, got all_tenants with {sorted(ids)}")
        if not self.all_tenants and not ids:
            raise ValueError("scope must name at least one of user_id, agent_id, run_id, or all_tenants=True, "
                             "got none")

    @property
    def filters(self) -> dict:
        return {k: getattr(self, k) for k in SCOPE_KEYS if getattr(self, k) is not None}

    def describe(self) -> str:
        return "all tenants" if self.all_tenants else ", ".join(f"{k}={v}" for k, v in self.filters.items())


def tenant_of(payload: dict) -> str:
    """The tenant of a memory: its scope ids (and actor), e.g. ``user_id=alice&run_id=r1``."""
    parts = [f"{k}={payload[k]}" for k in (*SCOPE_KEYS, "actor_id") if payload.get(k)]
    return "&".join(parts) or "unscoped"


# --------------------------------------------------------------------------- compress
@dataclass
class MergeGroup:
    """One merged memory: the memories it replaces (older first) and what is written."""

    tenant: str
    members: list[str]  # memory ids it replaces
    originals: list[str]  # original ids inside (metadata.merged_from)
    text: str
    new_id: str | None = None  # set once written


@dataclass
class Mem0CompressResult:
    scope: Scope
    n_in: int  # memories in the scope
    groups: list[MergeGroup]
    deleted: list[str]  # memory ids removed (empty on a dry run)
    left_alone: dict = field(default_factory=dict)  # reason -> count (expiring, procedural, no text)
    report: CompressReport | None = None
    backup: str | None = None
    dry_run: bool = False
    previews: dict = field(default_factory=dict)  # memory id -> (created_at, text) of the scope's memories
    relinked: int = 0  # entities of Mem0's entity store linked to a merged memory
    seconds: dict = field(default_factory=dict)  # wall time per step: read, compress, backup, add, verify, ...
    # what a review page shows: the scope's memories as a store, the merge log over their ids
    # (``planned``: a compaction dry run's first-round pairs instead)
    work: MemoryStore | None = None
    merges: list = field(default_factory=list)
    planned: bool = False


def default_backup_path(scope: Scope) -> str:
    slug = "all" if scope.all_tenants else "-".join(f"{v}" for v in scope.filters.values())
    slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in slug)[:60]
    return f"mem0-backup-{slug}-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.parquet"


def _eligible(p: Point) -> str | None:
    """Why a memory is left out of compression, or None."""
    if not isinstance(p.payload.get("data"), str) or not p.payload["data"].strip():
        return "no text"
    if p.payload.get("expiration_date"):
        return "has an expiration_date"
    if p.payload.get("memory_type") == "procedural_memory":
        return "procedural memory"
    return None


def _timestamp(p: Point) -> float:
    for key in ("created_at", "updated_at"):
        if p.payload.get(key):
            return parse_timestamp(p.payload[key], where=f"{key} of memory {p.id!r}")
    raise ValueError(f"memory {p.id!r} must have a created_at or updated_at, got neither")


def store_of_points(points: list[Point], embedder_name: str) -> MemoryStore:
    sources = []
    for p in points:
        mf = p.payload.get("merged_from")
        ok = isinstance(mf, list) and mf and all(isinstance(x, str) for x in mf)
        sources.append(list(mf) if ok else [p.id])
    return MemoryStore.from_columns(
        ids=[p.id for p in points], texts=[p.payload["data"] for p in points],
        timestamps=[_timestamp(p) for p in points], embeddings=np.stack([p.vector for p in points]),
        tenants=[tenant_of(p.payload) for p in points], sources=sources, embedder=embedder_name)


def single_vector(config: CompressConfig | None) -> CompressConfig | None:
    """``config`` with one vector per memory, as a Mem0 memory holds: ``merge.keys`` 0 (a merged
    memory's text's vector) or 1 (the blend of that vector and its sources' centre, the preset's)
    as given; more keys (K >= 2, or every source) become that one blend, with the config's text
    weight."""
    if config is None or config.merge.keys in (0, 1):
        return config
    return dataclasses.replace(config, merge=dataclasses.replace(config.merge, keys=1))


def compress_mem0(memory, scope: Scope, config: CompressConfig | None = None, *, merger=None, backup=None,
                  dry_run: bool = False, device=None, progress: bool = False,
                  after_write: Callable[[list[MergeGroup]], None] | None = None,
                  write_path: str = "batch") -> Mem0CompressResult:
    """Compress the memories of ``scope`` in ``memory`` (see the module docstring).

    ``backup``: where the scope's backup goes (default :func:`default_backup_path`).
    ``after_write``: called once every merged memory is stored and verified, before any
    original is deleted (a failure there leaves every original in place).
    ``write_path``: ``"batch"`` (Mem0's writes in batches) or ``"mem0"`` (``Memory.add`` /
    ``Memory.delete`` one memory at a time); both write the same rows.
    """
    check_write_path(write_path, config)
    clock = StageTimer()
    points = read_points(memory, scope.filters)
    clock.lap("read")
    todo, result = split_eligible(points, scope, dry_run, clock)
    if not todo:
        return result
    emb = Mem0Embedder(memory, device=device)
    check_dimension(memory, todo[0].vector.shape[0], {"the embedder's vectors": emb.dim})
    store = store_of_points(todo, emb.name)
    res = compress(store, single_vector(config), merger=merger, embedder=emb, device=device, progress=progress)
    clock.lap("compress")
    result.report = res.report
    result.work, result.merges = store, res.merges
    by_id = {p.id: p for p in todo}
    result.groups, vectors, _ = merge_groups(store, res.store, res.merges, by_id)
    if dry_run or not result.groups:
        return result
    write_back(memory, result, points, by_id, vectors, backup, after_write, clock, write_path)
    return result


def split_eligible(points: list[Point], scope: Scope, dry_run: bool,
                   clock: StageTimer) -> tuple[list[Point], Mem0CompressResult]:
    """The memories that can be compressed, and a result that counts the others by reason."""
    why = {p.id: _eligible(p) for p in points}
    left: dict[str, int] = {}
    for r in why.values():
        if r:
            left[r] = left.get(r, 0) + 1
    todo = [p for p in points if why[p.id] is None]
    previews = {p.id: (p.payload.get("created_at"), p.payload.get("data")) for p in todo}
    return todo, Mem0CompressResult(scope, len(points), [], [], left, dry_run=dry_run, previews=previews,
                                    seconds=clock.seconds)


def merge_groups(store: MemoryStore, out: MemoryStore, merges, by_id: dict) -> tuple[list, list, list[int]]:
    """One :class:`MergeGroup` per merged node of ``out`` (members older first), its vector,
    and its row in ``out``."""
    pos = {i: j for j, i in enumerate(store.ids)}
    members = {i: [i] for i in store.ids}
    for m in merges:
        members[m.into] = members.pop(m.a) + members.pop(m.b)
    groups, vectors, rows = [], [], []
    ts = store.timestamps.tolist()
    for j, (i, text, src, ten) in enumerate(zip(out.ids, out.texts, out.sources, out.tenants)):
        if i in by_id:
            continue
        mem = sorted(members[i], key=lambda x: (ts[pos[x]], pos[x]))
        groups.append(MergeGroup(ten, mem, list(src), text))
        vectors.append(out.embeddings[j].detach().cpu().float().numpy())
        rows.append(j)
    return groups, vectors, rows


def write_back(memory, result: Mem0CompressResult, points: list[Point], by_id: dict, vectors: list, backup,
               after_write, clock: StageTimer, write_path: str = "batch") -> None:
    """Backup of the scope, then the merged memories (added, verified, linked to entities),
    then (only then) the deletions; ``write_path`` as in :func:`compress_mem0`."""
    scope = result.scope
    result.backup = os.fspath(backup) if backup is not None else default_backup_path(scope)
    es = entity_store(memory)
    ents = read_points(memory, scope.filters, store=es) if es is not None else []
    write_backup(result.backup, points, provider=provider_of(memory), collection=memory.vector_store.collection_name,
                 scope=scope.filters, entities=ents, entity_collection=es.collection_name if es is not None else None)
    clock.lap("backup")
    if write_path == "mem0":
        for g in result.groups:
            g.new_id = _add_merged(memory, g, [by_id[x] for x in g.members])
    else:
        _add_merged_batch(memory, result.groups, by_id, vectors)
    clock.lap("add")
    _verify(memory, result.groups, vectors, [by_id[g.members[0]].payload for g in result.groups], result.backup)
    clock.lap("verify")
    result.relinked = _relink(es, ents, result.groups)
    clock.lap("relink")
    if after_write is not None:
        after_write(result.groups)
    if write_path == "mem0":
        for g in result.groups:
            for x in g.members:
                memory.delete(x)
                result.deleted.append(x)
    else:
        gone = [x for g in result.groups for x in g.members]
        delete_memories(memory, gone)
        result.deleted.extend(gone)
    clock.lap("delete")


def _merged_message(g: MergeGroup, members: list[Point]) -> tuple[dict, dict, dict]:
    """(message, scope ids, metadata) that Mem0's ``add`` is given for a merged memory."""
    first = members[0].payload
    newest = members[-1].payload  # members are in time order
    meta: dict = {}
    for p in members:
        meta.update({k: v for k, v in p.payload.items() if k not in _RESERVED})
    meta["merged_from"] = list(g.originals)
    meta["merged_by"] = "memforest"
    if newest.get("created_at"):
        meta["created_at"] = newest["created_at"]
    roles = {p.payload.get("role") for p in members}
    msg = {"role": roles.pop() if len(roles) == 1 and None not in roles else "user", "content": g.text}
    if first.get("actor_id"):
        msg["name"] = first["actor_id"]  # same for all: actor_id is part of the tenant
    return msg, {k: first[k] for k in SCOPE_KEYS if first.get(k)}, meta


def _add_merged(memory, g: MergeGroup, members: list[Point]) -> str:
    """The reference: one merged memory through ``Memory.add(..., infer=False)``."""
    msg, ids, meta = _merged_message(g, members)
    out = memory.add([msg], **ids, metadata=meta, infer=False)
    rows = out.get("results", []) if isinstance(out, dict) else out
    if len(rows) != 1 or not rows[0].get("id"):
        raise RuntimeError(f"Mem0 add must return one new memory for a merged text, got {out!r}; no original "
                           "was deleted")
    return str(rows[0]["id"])


def _add_merged_batch(memory, groups: list[MergeGroup], by_id: dict, vectors: list) -> None:
    """Every merged memory as ``Memory.add(..., infer=False)`` writes it, in batches."""
    now = datetime.now(UTC).isoformat()
    payloads = []
    for g in groups:
        msg, ids, meta = _merged_message(g, [by_id[x] for x in g.members])
        if msg["role"] == "system":  # Mem0's add skips system messages
            raise RuntimeError(f"Mem0 add must return one new memory for a merged text, got none for role 'system' "
                               f"({g.members[:3]}); no original was deleted")
        payloads.append(add_payload(msg["content"], meta, ids, msg["role"], msg.get("name"), now=now))
    for g, i in zip(groups, add_memories(memory, vectors, payloads)):
        g.new_id = i


def _relink(es, ents: list[Point], groups: list[MergeGroup]) -> int:
    """Link each merged memory to every entity one of its originals links to."""
    owner = {x: g.new_id for g in groups for x in g.members}
    n = 0
    for e in ents:
        linked = e.payload.get("linked_memory_ids")
        if not isinstance(linked, list):
            continue
        add = list(dict.fromkeys(owner[x] for x in linked if x in owner and owner[x] not in linked))
        if add:
            es.update(vector_id=e.id, vector=None, payload={**e.payload, "linked_memory_ids": linked + add})
            n += 1
    return n


def _verify(memory, groups: list[MergeGroup], vectors: list[np.ndarray], payloads: list[dict], backup: str) -> None:
    """Every merged memory is stored as written, read back from the vector store's own records
    by id in batches (:func:`~.vectors.read_ids`; no search and no ``get`` per memory): its
    text, the scope ids and actor of its originals (what a scoped search filters on), and its
    vector (cosine > 0.99 with the embedding of its text)."""
    got = read_ids(memory, [g.new_id for g in groups])
    for g, vec, p in zip(groups, vectors, payloads):
        r = got.get(g.new_id)
        why = None
        if r is None:
            why = "is not in the vector store"
        elif r.payload.get("data") != g.text:
            why = "is not stored as written"
        elif any(r.payload.get(key) != p.get(key) for key in (*SCOPE_KEYS, "actor_id") if p.get(key)):
            why = "is stored outside its scope"
        elif float(np.dot(r.vector, vec) / (np.linalg.norm(r.vector) * np.linalg.norm(vec) + 1e-12)) <= 0.99:
            why = "is stored with another vector than its text's"
        if why:
            raise RuntimeError(f"merged memory {g.new_id} {why}; no original was deleted (restore with: "
                               f"memforest mem0 restore {backup})")
