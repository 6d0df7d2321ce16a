"""A store file kept within a node limit per tenant as memories are added: the object for a
service (:class:`CompactingStore`). All its state is in the files (store, inbox, journal), so
a restarted process carries on; a compaction is :func:`~.compact_run.compact_file`."""
from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa

from ..config import CompactConfig, CompressConfig
from ..renamed import renamed_keyword
from ..store.io import detect_format, read_store
from ..store.memory_store import MemoryStore
from .compact_files import NoModel, PassThrough, memforest_layout, parquet_schema, store_folded
from .compact_run import CompactFileResult, compact_file
from .errors import OptionError
from .inbox import ids_in, read_inbox
from .inbox_files import inbox_path
from .outputs import OutputLock

__all__ = ["CompactingStore"]


class CompactingStore:
    """A store file kept within a node limit per tenant as memories are added.

        cs = CompactingStore("memories.parquet", CompactConfig(max_nodes=500), embedder=emb)
        cs.add([{"id": "m1", "text": "...", "timestamp": 1715000000, "tenant": "alice"}])

    ``add`` appends the records to the inbox (``STORE.inbox.jsonl``, fsynced; records without
    ``embedding`` are embedded first with ``embedder``) and, with ``auto``, compacts the
    store when a tenant it added to is over its limit. Adding is idempotent by id: a record
    whose id the store holds as a node with the same text is dropped when the inbox is folded
    in; an id already waiting in the inbox, or one that is an original inside a merged node
    (its text is gone, nothing to compare), is refused. Nothing lives only in
    memory: a new object on the same files carries on (the tenant counts are read again).
    """

    def __init__(self, path, limits: CompactConfig | None = None, config: CompressConfig | None = None, *,
                 embedder=None, merger="extractive", device=None, auto: bool = True, **renamed):
        limits = renamed_keyword("CompactingStore", renamed, "budget", "limits", limits)
        if limits is None:
            raise TypeError("CompactingStore() missing its limits (a CompactConfig)")
        self.path = os.fspath(path)
        self.limits, self.config, self.embedder = limits, config or CompressConfig(), embedder
        self.merger, self.device, self.auto = merger, device, auto
        self.last: CompactFileResult | None = None

    def counts(self) -> dict[str, int]:
        """Nodes per tenant, inbox included (its complete records)."""
        counts = self._store_counts()
        for r in self._waiting().records:
            t = r.get("tenant") or self._only_tenant(counts)
            counts[t] = counts.get(t, 0) + 1
        return counts

    def _inside_merged(self, ids: list[str]) -> dict:
        """Those of ``ids`` that are originals inside a merged node of the store (id -> node)."""
        if not os.path.exists(self.path):
            return {}
        wanted = pa.array(ids, type=pa.large_string())
        if self._pass_through():
            return PassThrough(self.path).ids_in(wanted).inside
        return ids_in(read_store(self.path, embedder=NoModel()), wanted).inside

    def _waiting(self):
        """The inbox's records not yet folded in (every inbox file, :mod:`.inbox_files`)."""
        return read_inbox(self.path, store_folded(self.path) if os.path.exists(self.path) else [])

    def _store_counts(self) -> dict[str, int]:
        if not os.path.exists(self.path):
            return {}
        if self._pass_through():
            return PassThrough(self.path).tenant_counts()
        try:
            st = read_store(self.path, embedder=NoModel())
        except ValueError as e:  # the reader names the file; NoModel's message names an option
            if isinstance(e.__cause__, OptionError):
                raise OptionError(f"{self.path}: {e.__cause__.template}") from None
            raise
        return dict(zip(st.tenant_table, np.bincount(st.tenant_codes_np).tolist()))

    def _only_tenant(self, counts: dict) -> str:
        if len(counts) != 1:
            raise ValueError(f"tenant of a new memory must be given when the store has {len(counts)} tenants, "
                             "got none")
        return next(iter(counts))

    def _pass_through(self) -> bool:
        return detect_format(self.path) == "parquet" and memforest_layout(parquet_schema(self.path))

    def add(self, records: list[dict]) -> CompactFileResult | None:
        """Append ``records`` (the store's record layout) to the inbox; compact when a tenant
        is over its limit (with ``auto``). Returns the compaction's result, if one ran. A record
        without ``tenant`` goes to the store's only tenant (refused when it has several)."""
        recs = [dict(r) for r in records]
        if any(r.get("tenant") is None for r in recs):
            only = self._only_tenant(self._store_counts())
            for r in recs:
                r["tenant"] = r.get("tenant") or only
        todo = [r for r in recs if r.get("embedding") is None]
        if todo:
            if self.embedder is None:
                raise ValueError("records without an embedding need the CompactingStore's embedder")
            vecs = self.embedder.embed([r["text"] for r in todo]).detach().cpu().float().numpy()
            for r, v in zip(todo, vecs):
                r["embedding"] = v.tolist()
        MemoryStore.from_records(recs)  # refuse bad records (and ids repeated among them) before the inbox
        waiting = {r["id"] for r in self._waiting().records}
        for r in recs:
            if str(r["id"]) in waiting:
                raise ValueError(f"id of a new memory must not be in the inbox already, got {r['id']!r}")
        inside = self._inside_merged([str(r["id"]) for r in recs])
        if inside:
            i, node = next(iter(inside.items()))
            raise ValueError(f"id of a new memory must not be an original inside a merged node, got {i!r} (inside "
                             f"{node!r}, whose own text is gone: it cannot be compared or replaced); give it a new id")
        with OutputLock(self.path, also=[inbox_path(self.path)]), open(inbox_path(self.path), "ab") as f:
            f.write(b"".join(json.dumps(r, ensure_ascii=False).encode("utf-8") + b"\n" for r in recs))
            f.flush()
            os.fsync(f.fileno())
        if not self.auto:
            return None
        counts = self.counts()
        touched = {r["tenant"] for r in recs}
        if any((self.limits.max_nodes_of(t) or 0) and counts.get(t, 0) > self.limits.max_nodes_of(t) for t in touched):
            return self.compact()
        return None

    def compact(self, *, dry_run: bool = False) -> CompactFileResult:
        """Compact now (folds the inbox even when no tenant is over its limit)."""
        if not os.path.exists(self.path):
            raise FileNotFoundError(f"memory store file not found: {self.path!r}")
        emb = "none" if self.embedder is None else self.embedder
        self.last = compact_file(self.path, self.limits, self.config, embedder=emb, merger=self.merger,
                                 device=self.device, dry_run=dry_run)
        return self.last

    def store(self) -> MemoryStore:
        """The store file as it is now (the inbox not included)."""
        return read_store(self.path, device=self.device)
