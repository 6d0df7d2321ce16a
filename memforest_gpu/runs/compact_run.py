"""``memforest compact STORE``: keep every tenant of a store file within its node limit, in place.

:func:`compact_file` folds the inbox (``STORE.inbox.jsonl``) into the store and compacts
every tenant over its limit (:func:`~memforest_gpu.engine.compaction.compact`), under the
store's lock (``STORE.lock``), with the merge journal (``STORE.journal.jsonl``), and writes
the store atomically: a kill at any point leaves the previous store whole, and the next run
replays the journaled merges (``--resume`` or not: the journal's records are keyed by their
exact inputs, so a record is only ever replayed for the pair it was made from) and reaches
the same store. A journal made with another config, merger or embedder is refused.

The inbox is read, taken and released by the protocol of :mod:`.inbox_files` (no append is
lost, no record folded twice). :class:`~.compacting_store.CompactingStore` is the same for a
service: ``add`` appends to the inbox, and the store is compacted when a tenant goes over
its limit.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from dataclasses import dataclass

import numpy as np

from ..config import CompactConfig, CompressConfig
from ..engine.compaction import CompactReport, compact
from ..mergers.embedders import MEAN_EMBEDDER
from ..renamed import renamed_keyword
from ..store.atomic import atomic_open
from ..store.event_trees import EventTrees
from ..store.io import detect_format, read_store, write_store
from ..store.memory_store import MemoryStore
from ..store.parquet import vector_codes_of
from ..store.splice import append, splice
from ..timer import StageTimer
from .compact_files import NoModel, PassThrough, memforest_layout, parquet_schema, placeless, store_folded
from .driver import resolve_merger
from .errors import OptionError
from .inbox import drop_rows, ids_in, read_inbox
from .inbox_files import folded_entry, inbox_path, release, take, taken_paths
from .journal import JournaledMerger, journal_path, merger_identity
from .loading import RunInterrupted, load_store_and_embedder, resolve_embedder
from .outputs import OutputLock
from .preflight import check_store

__all__ = ["compact_file", "CompactFileResult", "compact_fingerprint"]

log = logging.getLogger("memforest_gpu")


@dataclass
class CompactFileResult:
    """What :func:`compact_file` did; ``written``: whether the store file was rewritten."""

    report: CompactReport
    written: bool
    inbox: int = 0  # inbox records folded into the store
    inbox_known: int = 0  # inbox records the store already held (not folded again)
    inbox_incomplete: list = dataclasses.field(default_factory=list)  # inbox files whose last line has no newline
    inbox_replaced: int = 0  # store nodes replaced by inbox records (replace_changed)
    replayed: int = 0  # merges taken from the journal
    seconds: dict = dataclasses.field(default_factory=dict)
    # with review=True: the compacted tenants' rows before the run, the merge log over them and
    # a dry run's first-round pairs (what a review page shows)
    work: MemoryStore | None = None
    merges: list = dataclasses.field(default_factory=list)
    planned: list = dataclasses.field(default_factory=list)


def compact_fingerprint(config: CompressConfig, limits: CompactConfig, merger, embedder: str) -> dict:
    """What a compaction's journal must match: config, limits (the record's ``budget``), merger and
    embedder (not the store's bytes: a journal record names its exact inputs, so a later state
    may replay it)."""
    parts = {"config": dataclasses.asdict(config), "budget": dataclasses.asdict(limits),
             "merger": merger_identity(merger), "embedder": embedder, "mode": "compact"}
    blob = json.dumps(parts, sort_keys=True, default=str)
    return {"fingerprint": hashlib.sha256(blob.encode("utf-8")).hexdigest(),
            "parts": json.loads(json.dumps(parts, default=str))}


def compact_file(path, limits: CompactConfig | None = None, config: CompressConfig | None = None, *, embedder="auto",
                 merger="extractive", merger_options: dict | None = None, device=None, progress: bool = False,
                 dry_run: bool = False, journal: bool = True, replace_changed: bool = False,
                 review: bool = False, **renamed) -> CompactFileResult:
    """Compact the store file ``path`` in place (see the module docstring); nothing is
    written when no tenant is over its limit and the inbox is empty, or with ``dry_run``.
    ``limits``: the nodes each tenant may hold (``budget=``: its old name).

    ``embedder``: as ``--embedder`` (``auto``, ``default``, ``none``, a model folder), or an
    embedder object. ``merger``: a name (with ``merger_options``) or a merger object.
    The inbox is read by its protocol (:mod:`.inbox`); ``replace_changed``: an inbox record
    whose id is an unmerged node of the store with other text replaces that node (without
    it, such a record refuses the run). A dry run takes no lock and writes nothing, so it
    runs on a read-only store. ``review``: keep what a review page shows in the result
    (``work``, ``merges``; a dry run also plans its first round: ``planned``).
    """

    limits = renamed_keyword("compact_file", renamed, "budget", "limits", limits)
    if limits is None:
        raise TypeError("compact_file() missing its limits (a CompactConfig)")
    path = os.fspath(path)
    check_store(path, dry_run=dry_run)  # its folder must take the lock, the journal and the new store
    cfg = config or CompressConfig()
    merger = resolve_merger(merger, merger_options)
    run = _Run(path, limits, cfg, embedder, merger, device, progress, dry_run, journal, replace_changed)
    run.review = review
    if dry_run:
        return run.run()
    with OutputLock(path, also=[inbox_path(path), *taken_paths(path)]):  # the inbox is taken and released under it
        return run.run()


class _Run:
    """One compaction of a file, under its lock."""

    def __init__(self, path, limits, cfg, embedder, merger, device, progress, dry_run, journal, replace):
        self.path, self.limits, self.cfg, self.spec = path, limits, cfg, embedder
        self.merger, self.device, self.progress, self.dry_run, self.journal = merger, device, progress, dry_run, journal
        self.replace = replace
        self.review = False
        self.counts = None  # a pass-through store's nodes per tenant, read once
        self.folded: list[dict] = []  # the taken inbox bytes this run folds (recorded with the store)
        self.restart: set = set()  # tenants whose tree centre an inbox record replaced: partitioned again
        self.gone_rows, self.gone_tenants = np.zeros(0, dtype=np.int64), []  # pass-through: rows replaced
        self.timer = StageTimer()
        fmt = detect_format(path)
        self.pt = None
        if fmt == "parquet" and memforest_layout(parquet_schema(path)):
            self.pt = PassThrough(path)

    def run(self) -> CompactFileResult:
        """Read and check the inbox, take it, compact, write the store with the record of the
        inbox bytes it folded, then release them (:mod:`.inbox_files`: no append is lost, no
        record folded twice)."""
        emb, store = self._embedder_and_store()
        folded = store_folded(self.path)
        if not self.dry_run:
            release(self.path, folded)  # what a run killed after writing the store left in its taken files
        box = read_inbox(self.path, folded)
        store, inbox = self._settle(box, store, emb)
        live = taken = inbox_path(self.path)
        if not self.dry_run and box.read.get(live):
            taken = take(self.path)  # appends from now on go to a new inbox
            box.read[taken] = box.read.pop(live)
        self.folded = [folded_entry(p, data) for p, data in box.read.items() if p != live]
        self.timer.lap("read")
        if self.pt is not None:
            res, written = self._run_pass_through(inbox, emb)
        else:
            res, written = self._run_whole(store, inbox, emb)
        if not self.dry_run:
            release(self.path, self.folded)  # the store holds them (written), or held them already (known)
        res.seconds = self.timer.finish()
        res.inbox = len(inbox) if inbox is not None and written else 0
        res.inbox_known = box.known
        res.inbox_incomplete = [taken if p == live else p for p in box.incomplete]
        res.inbox_replaced = len(box.replaced) if written else 0
        return res

    def _settle(self, box, store: MemoryStore | None, emb):
        """The inbox's records as a store, by the protocol (:mod:`.inbox`): tenants given,
        records the store holds counted and left out, replaced nodes dropped from ``store``."""
        if not box.records:
            return store, None
        box.set_tenants(store.tenant_names() if store is not None else sorted(self._counts()))
        held = ids_in(store, box.wanted()) if store is not None else self.pt.ids_in(box.wanted())
        box.settle(held, replace=self.replace)
        dim = store.dim if store is not None else self.pt.schema.field("embedding").type.list_size
        inbox = box.store(emb if emb is not None else NoModel(), dim)
        if box.replaced:
            self.restart = {held.tenant[i] for i in box.replaced if self._is_centre(i, held.tenant[i], store)}
            if store is not None:
                store = drop_rows(store, box.replaced)
                if store.event_trees is not None:
                    store.event_trees.tenants = {t: v for t, v in store.event_trees.tenants.items()
                                                 if t not in self.restart}
            else:
                self.gone_rows = np.sort(np.array([held.row[i] for i in box.replaced], dtype=np.int64))
                self.gone_tenants = [held.tenant[i] for i in box.replaced]
        return store, inbox

    def _counts(self) -> dict:
        if self.counts is None:
            self.counts = self.pt.tenant_counts()
        return self.counts

    def _is_centre(self, node_id: str, tenant: str, store) -> bool:
        states = (store.event_trees.tenants if store.event_trees is not None else {}) if store is not None \
            else self.pt.states()
        return tenant in states and node_id in states[tenant].centres

    def _embedder_and_store(self):
        if self.pt is None:
            if not isinstance(self.spec, str):  # a model object
                return self.spec, read_store(self.path, embedder=self.spec, device=self.device)
            store, emb = load_store_and_embedder(self.path, embedder=self.spec, device=self.device)
            return emb, store

        name = self.pt.embedder()
        emb = self.spec if not isinstance(self.spec, str) else resolve_embedder(self.spec, name, device=self.device)
        if emb is not None and emb.dim != self.pt.schema.field("embedding").type.list_size:
            raise OptionError(f"{{embedder}}'s dimension must match the store's "
                              f"({self.pt.schema.field('embedding').type.list_size}), got {emb.dim} from {emb.name!r}")
        return emb, None

    def _merger(self, emb):
        if not self.journal or self.dry_run:
            return self.merger, None
        fp = compact_fingerprint(self.cfg, self.limits, self.merger, emb.name if emb is not None else MEAN_EMBEDDER)
        jm = JournaledMerger(self.merger, journal_path(self.path), fingerprint=fp, resume=True)
        return jm, jm

    def _compact(self, store: MemoryStore, emb):
        merger, jm = self._merger(emb)
        load = getattr(self.merger, "load", None)
        if callable(load) and not self.dry_run:
            load()
        try:
            res = compact(store, self.limits, self.cfg, merger=merger, embedder=emb, device=self.device,
                          progress=self.progress, dry_run=self.dry_run, plan=self.review and self.dry_run)
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
            if res.store.event_trees is None:
                res.store.event_trees = EventTrees.empty(len(res.store))
            res.store.event_trees.folded = self.folded
            write_store(res.store, self.path, time_format=store.time_format)
            self.timer.lap("write")
        return self._done(res, jm, written), written

    def _run_pass_through(self, inbox: MemoryStore | None, emb):
        counts = dict(self._counts())
        gone = self.gone_rows  # file rows replaced by inbox records
        if inbox is not None:
            for t, c in zip(inbox.tenant_table, np.bincount(inbox.tenant_codes_np).tolist()):
                counts[t] = counts.get(t, 0) + c
        for t in self.gone_tenants:
            counts[t] -= 1
        over = [t for t, c in counts.items() if (self.limits.max_nodes_of(t) or 0) and c > self.limits.max_nodes_of(t)]
        n = self.pt.n
        if not over and inbox is None:  # nothing to do: only the tenant column was read
            return CompactFileResult(CompactReport([], n, n, len(counts), dry_run=self.dry_run), False), False
        sub, rows = self.pt.load(over)  # every batch as Arrow; only the over-limit tenants' rows as a store
        restart = self.restart
        kept = rows
        if sub is not None and len(gone):
            keep = ~np.isin(rows, gone)
            sub, kept = (sub.take(np.flatnonzero(keep)) if keep.any() else None), rows[keep]
        if sub is not None and sub.event_trees is not None and restart:
            sub.event_trees.tenants = {t: v for t, v in sub.event_trees.tenants.items() if t not in restart}
        self.timer.lap("read")
        parts, keys = [], []
        if sub is not None:
            parts.append(sub)
            keys.append(kept)
        if inbox is not None:
            parts.append(placeless(inbox))
            keys.append(n + np.arange(len(inbox)))
        work = splice(parts, keys) if len(parts) > 1 else parts[0]
        work.vector_codes = vector_codes_of(self.pt.schema)  # new rows take the file's codes (store/codes.py)
        wkeys = np.sort(np.concatenate(keys))
        res, jm = self._compact(work, emb)
        self.timer.lap("compact")
        if self.dry_run:
            return self._done(res, None, False), False
        drop = np.union1d(rows, gone)
        with atomic_open(self.path) as f:
            states = {t: v for t, v in self.pt.states().items() if t not in restart}
            states.update(res.store.event_trees.tenants if res.store.event_trees is not None else {})
            self.pt.write(f, res.store, wkeys[res.keys], drop, states, self.folded)
        self.timer.lap("write")
        res.report.nodes_in = n - len(gone) + (len(inbox) if inbox is not None else 0)
        res.report.nodes_out = n - len(drop) + len(res.store)
        res.report.tenants_in = len(counts)
        return self._done(res, jm, True), True

    def _done(self, res, jm, written: bool) -> CompactFileResult:
        replayed = jm.stats["replayed"] if jm is not None else 0
        if jm is not None and written:
            jm.finish()
        elif jm is not None and not res.merges:
            jm.finish()  # nothing merged, nothing journaled worth keeping
        out = CompactFileResult(res.report, written, replayed=replayed)
        if self.review:
            out.work, out.merges, out.planned = res.work, res.merges, res.planned
        return out
