"""``memforest compact STORE``: keep every tenant of a store file within its budget, in place.

:func:`compact_file` folds the inbox (``STORE.inbox.jsonl``) into the store and compacts
every tenant over its budget (:func:`~memforest_gpu.engine.compact.compact`), under the
store's lock (``STORE.lock``), with the merge journal (``STORE.journal.jsonl``), and writes
the store atomically: a kill at any point leaves the previous store whole, and the next run
replays the journaled merges (``--resume`` or not: the journal's records are keyed by their
exact inputs, so a record is only ever replayed for the pair it was made from) and reaches
the same store. A journal made with another config, merger or embedder is refused.

:class:`CompactingStore` is the same for a service: ``add`` appends to the inbox, and the
store is compacted when a tenant goes over budget. Its state is the files (store, inbox,
journal), so a restarted process carries on where the last one stopped.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..config import CompactConfig, CompressConfig
from ..engine.compact import CompactReport, compact
from ..mergers import get_merger
from ..mergers.embedders import MEAN_EMBEDDER
from ..store.atomic import atomic_open, atomic_write_text, fsync_dir
from ..store.event_trees import EventTrees
from ..store.io import detect_format, read_store, write_store
from ..store.memory_store import MemoryStore
from ..store.parquet import PARQUET_EMBEDDER_KEY
from ..store.splice import append, splice
from ..timer import StageTimer
from .compact_files import PassThrough, drop_known, inbox_path, memforest_layout, read_inbox
from .journal import JournaledMerger, journal_path, merger_identity
from .loading import RunInterrupted, load_store_and_embedder, resolve_embedder
from .outputs import OutputLock

__all__ = ["compact_file", "CompactFileResult", "CompactingStore", "compact_fingerprint"]

log = logging.getLogger("memforest_gpu")


@dataclass
class CompactFileResult:
    """What :func:`compact_file` did; ``written``: whether the store file was rewritten."""

    report: CompactReport
    written: bool
    inbox: int = 0  # inbox records folded into the store
    replayed: int = 0  # merges taken from the journal
    seconds: dict = dataclasses.field(default_factory=dict)


def compact_fingerprint(config: CompressConfig, budget: CompactConfig, merger, embedder: str) -> dict:
    """What a compaction's journal must match: config, budget, merger and embedder (not the
    store's bytes: a journal record names its exact inputs, so a later state may replay it)."""
    parts = {"config": dataclasses.asdict(config), "budget": dataclasses.asdict(budget),
             "merger": merger_identity(merger), "embedder": embedder, "mode": "compact"}
    blob = json.dumps(parts, sort_keys=True, default=str)
    return {"fingerprint": hashlib.sha256(blob.encode("utf-8")).hexdigest(),
            "parts": json.loads(json.dumps(parts, default=str))}


def compact_file(path, budget: CompactConfig, config: CompressConfig | None = None, *, embedder="auto",
                 merger="extractive", merger_options: dict | None = None, device=None, progress: bool = False,
                 dry_run: bool = False, journal: bool = True) -> CompactFileResult:
    """Compact the store file ``path`` in place (see the module docstring); nothing is
    written when no tenant is over budget and the inbox is empty, or with ``dry_run``.

    ``embedder``: as ``--embedder`` (``auto``, ``default``, ``none``, a model folder), or an
    embedder object. ``merger``: a name (with ``merger_options``) or a merger object.
    """

    path = os.fspath(path)
    detect_format(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"memory store file not found: {path!r}")
    cfg = config or CompressConfig()
    if isinstance(merger, str):
        merger = get_merger(merger, **(merger_options or {}))
    with OutputLock(path):
        return _Run(path, budget, cfg, embedder, merger, device, progress, dry_run, journal).run()


class _Run:
    """One compaction of a file, under its lock."""

    def __init__(self, path, budget, cfg, embedder, merger, device, progress, dry_run, journal):
        self.path, self.budget, self.cfg, self.spec = path, budget, cfg, embedder
        self.merger, self.device, self.progress, self.dry_run, self.journal = merger, device, progress, dry_run, journal
        self.timer = StageTimer()
        fmt = detect_format(path)
        self.pt = None
        if fmt == "parquet" and memforest_layout(pq.read_schema(path)):
            self.pt = PassThrough(path)

    def run(self) -> CompactFileResult:
        emb, store = self._embedder_and_store()
        inbox, consumed = read_inbox(inbox_path(self.path), emb if emb is not None else _NoModel())
        if inbox is not None:
            inbox = self._new_only(inbox, store)
        self.timer.lap("read")
        if self.pt is not None:
            res, written = self._run_pass_through(inbox, emb)
        else:
            res, written = self._run_whole(store, inbox, emb)
        if written:
            self._consume_inbox(consumed)
        res.seconds = self.timer.finish()
        res.inbox = len(inbox) if inbox is not None and written else 0
        return res

    def _embedder_and_store(self):
        if self.pt is None:
            if not isinstance(self.spec, str):  # a model object
                return self.spec, read_store(self.path, embedder=self.spec, device=self.device)
            store, emb = load_store_and_embedder(self.path, embedder=self.spec, device=self.device)
            return emb, store

        name = (self.pt.schema.metadata or {}).get(PARQUET_EMBEDDER_KEY)
        name = name.decode("utf-8") if name else None
        emb = self.spec if not isinstance(self.spec, str) else resolve_embedder(self.spec, name, device=self.device)
        if emb is not None and emb.dim != self.pt.schema.field("embedding").type.list_size:
            raise ValueError(f"--embedder's dimension must match the store's "
                             f"({self.pt.schema.field('embedding').type.list_size}), got {emb.dim} from {emb.name!r}")
        return emb, None

    def _new_only(self, inbox: MemoryStore, store: MemoryStore | None) -> MemoryStore | None:
        """The inbox without the records the store already holds (folded by a run that was
        killed before it could empty the inbox)."""

        if self.pt is not None:
            hit = self.pt.known(inbox.ids.arrow)
            keep = np.flatnonzero(~hit)
            return inbox.take(keep) if len(keep) else None
        known = pa.concat_arrays([store.ids.arrow, store.sources.arrow.flatten().cast(pa.large_string())])
        return drop_known(inbox, known)

    def _merger(self, emb):
        if not self.journal or self.dry_run:
            return self.merger, None
        fp = compact_fingerprint(self.cfg, self.budget, self.merger, emb.name if emb is not None else MEAN_EMBEDDER)
        jm = JournaledMerger(self.merger, journal_path(self.path), fingerprint=fp, resume=True)
        return jm, jm

    def _compact(self, store: MemoryStore, emb):
        merger, jm = self._merger(emb)
        load = getattr(self.merger, "load", None)
        if callable(load) and not self.dry_run:
            load()
        try:
            res = compact(store, self.budget, self.cfg, merger=merger, embedder=emb, device=self.device,
                          progress=self.progress, dry_run=self.dry_run)
        except KeyboardInterrupt:
            n = len(jm.done) if jm is not None else 0
            raise RunInterrupted(f"interrupted; the store is unchanged and {n} merges are journaled in "
                                 f"{journal_path(self.path)!r}: rerun the same command to continue from them") from None
        finally:
            if jm is not None:
                jm.close()
        return res, jm

    def _run_whole(self, store: MemoryStore, inbox: MemoryStore | None, emb):
        if inbox is not None:
            store = append(store, inbox)
        res, jm = self._compact(store, emb)
        self.timer.lap("compact")
        written = not self.dry_run and (res.store is not store or inbox is not None)
        if written:
            write_store(res.store, self.path, time_format=store.time_format)
            self.timer.lap("write")
        return self._done(res, jm, written), written

    def _run_pass_through(self, inbox: MemoryStore | None, emb):
        counts = self.pt.tenant_counts()
        if inbox is not None:
            for t, c in zip(inbox.tenant_table, np.bincount(inbox.tenant_codes_np).tolist()):
                counts[t] = counts.get(t, 0) + c
        over = [t for t, c in counts.items() if (self.budget.budget(t) or 0) and c > self.budget.budget(t)]
        n = self.pt.n
        if not over and inbox is None:  # nothing to do: only the tenant column was read
            return CompactFileResult(CompactReport([], n, n, len(counts), dry_run=self.dry_run), False), False
        sub, rows = self.pt.load(over)  # every batch as Arrow; only the over-budget tenants' rows as a store
        self.timer.lap("read")
        parts, keys = [], []
        if sub is not None:
            parts.append(sub)
            keys.append(rows)
        if inbox is not None:
            parts.append(_placeless(inbox))
            keys.append(n + np.arange(len(inbox)))
        work = splice(parts, keys) if len(parts) > 1 else parts[0]
        wkeys = np.sort(np.concatenate(keys))
        res, jm = self._compact(work, emb)
        self.timer.lap("compact")
        if self.dry_run:
            return self._done(res, None, False), False
        with atomic_open(self.path) as f:
            states = self.pt.states()
            states.update(res.store.event_trees.tenants if res.store.event_trees is not None else {})
            self.pt.write(f, res.store, wkeys[res.keys], rows, states)
        self.timer.lap("write")
        res.report.nodes_in = n + (len(inbox) if inbox is not None else 0)
        res.report.nodes_out = n - len(rows) + len(res.store)
        res.report.tenants_in = len(counts)
        return self._done(res, jm, True), True

    def _done(self, res, jm, written: bool) -> CompactFileResult:
        replayed = jm.stats["replayed"] if jm is not None else 0
        if jm is not None and written:
            jm.finish()
        elif jm is not None and not res.merges:
            jm.finish()  # nothing merged, nothing journaled worth keeping
        return CompactFileResult(res.report, written, replayed=replayed)

    def _consume_inbox(self, consumed: int) -> None:
        """Drop the folded records from the inbox, keeping anything appended after them."""
        p = inbox_path(self.path)
        if not os.path.exists(p):
            return
        with open(p, "rb") as f:
            rest = f.read()[consumed:]
        if rest.strip():
            atomic_write_text(p, rest.decode("utf-8"))
        else:
            os.unlink(p)
            fsync_dir(os.path.dirname(os.path.abspath(p)))


def _placeless(st: MemoryStore) -> MemoryStore:
    """``st`` with no row in a tree (new memories)."""

    st.event_trees = EventTrees.empty(len(st))
    return st


class _NoModel:
    """Stands in for a model when the store's is unknown: inbox records must then carry vectors."""

    name = None
    dim = 0

    def embed(self, texts):
        raise ValueError("inbox records without embeddings need a model: the store records none, pass "
                         "--embedder default or PATH")


class CompactingStore:
    """A store file kept within a budget per tenant as memories are added.

        cs = CompactingStore("memories.parquet", CompactConfig(max_nodes=500), embedder=emb)
        cs.add([{"id": "m1", "text": "...", "timestamp": 1715000000, "tenant": "alice"}])

    ``add`` appends the records to the inbox (``STORE.inbox.jsonl``, fsynced; records without
    ``embedding`` are embedded first with ``embedder``) and, with ``auto``, compacts the
    store when a tenant it added to is over budget. Adding is idempotent by id: a record
    whose id the store already holds (as a node or inside a merged node) is dropped when the
    inbox is folded in; an id already waiting in the inbox is refused. Nothing lives only in
    memory: a new object on the same files carries on (the tenant counts are read again).
    """

    def __init__(self, path, budget: CompactConfig, config: CompressConfig | None = None, *, embedder=None,
                 merger="extractive", device=None, auto: bool = True):
        self.path = os.fspath(path)
        self.budget, self.config, self.embedder = budget, config or CompressConfig(), embedder
        self.merger, self.device, self.auto = merger, device, auto
        self.last: CompactFileResult | None = None

    def counts(self) -> dict[str, int]:
        """Nodes per tenant, inbox included."""
        counts = {}
        if os.path.exists(self.path):
            st = read_store(self.path, embedder=_NoModel()) if not self._pass_through() else None
            counts = PassThrough(self.path).tenant_counts() if st is None else \
                dict(zip(st.tenant_table, np.bincount(st.tenant_codes_np).tolist()))
        p = inbox_path(self.path)
        if os.path.exists(p):
            with open(p, "rb") as f:
                data = f.read()
            for line in data[:data.rfind(b"\n") + 1].split(b"\n"):
                if line.strip():
                    t = json.loads(line).get("tenant") or "default"
                    counts[t] = counts.get(t, 0) + 1
        return counts

    def _inbox_ids(self) -> set[str]:
        p = inbox_path(self.path)
        if not os.path.exists(p):
            return set()
        with open(p, "rb") as f:
            data = f.read()
        return {str(json.loads(x)["id"]) for x in data[:data.rfind(b"\n") + 1].split(b"\n") if x.strip()}

    def _pass_through(self) -> bool:
        return detect_format(self.path) == "parquet" and memforest_layout(pq.read_schema(self.path))

    def add(self, records: list[dict]) -> CompactFileResult | None:
        """Append ``records`` (the store's record layout) to the inbox; compact when a tenant
        is over budget (with ``auto``). Returns the compaction's result, if one ran."""
        recs = [dict(r) for r in records]
        todo = [r for r in recs if r.get("embedding") is None]
        if todo:
            if self.embedder is None:
                raise ValueError("records without an embedding need the CompactingStore's embedder")
            vecs = self.embedder.embed([r["text"] for r in todo]).detach().cpu().float().numpy()
            for r, v in zip(todo, vecs):
                r["embedding"] = v.tolist()
        MemoryStore.from_records(recs)  # refuse bad records (and ids repeated among them) before the inbox
        waiting = self._inbox_ids()
        for r in recs:
            if str(r["id"]) in waiting:
                raise ValueError(f"id of a new memory must not be in the inbox already, got {r['id']!r}")
        with OutputLock(self.path), open(inbox_path(self.path), "ab") as f:
            f.write(b"".join(json.dumps(r, ensure_ascii=False).encode("utf-8") + b"\n" for r in recs))
            f.flush()
            os.fsync(f.fileno())
        if not self.auto:
            return None
        counts = self.counts()
        touched = {r.get("tenant") or "default" for r in recs}
        if any((self.budget.budget(t) or 0) and counts.get(t, 0) > self.budget.budget(t) for t in touched):
            return self.compact()
        return None

    def compact(self, *, dry_run: bool = False) -> CompactFileResult:
        """Compact now (folds the inbox even when no tenant is over budget)."""
        if not os.path.exists(self.path):
            raise FileNotFoundError(f"memory store file not found: {self.path!r}")
        emb = "none" if self.embedder is None else self.embedder
        self.last = compact_file(self.path, self.budget, self.config, embedder=emb, merger=self.merger,
                                 device=self.device, dry_run=dry_run)
        return self.last

    def store(self) -> MemoryStore:
        """The store file as it is now (the inbox not included)."""
        return read_store(self.path, device=self.device)
