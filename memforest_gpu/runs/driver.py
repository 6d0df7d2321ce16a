"""The skeleton of a compress run of a file, shared by the in-memory run (:mod:`.single`) and
the ``--memory-budget`` run (:mod:`.budgeted`):

1. :func:`run_locked`: every check that needs nothing loaded (:func:`~.preflight.preflight`),
   the merger made from its name, the output's folder created and its lock held
   (:class:`~.outputs.OutputLock`) while the run writes;
2. :class:`MergerRun`: the run's merger behind its journal (:class:`~.journal.JournaledMerger`,
   opened at the first compression: its fingerprint names the embedder), the model loaded
   before any work, and a run that stops after a round whose every request failed
   (:class:`MergerFailedError`);
3. the report of the run's parts: :meth:`~memforest_gpu.report.CompressReport.combine`.

The distributed run (:mod:`memforest_gpu.distributed.files`) shares all three: its preflight,
one :class:`MergerRun` per rank (each rank its own journal) and the combined report.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable

from ..engine import CompressResult, MemoryPlan, compress
from ..mergers import get_merger
from ..mergers.embedders import MEAN_EMBEDDER
from .budget_groups import parts_dir
from .journal import JournaledMerger, JournalExistsError, journal_path, run_fingerprint
from .loading import RunInterrupted
from .outputs import OutputLock
from .preflight import preflight

__all__ = ["run_locked", "resolve_merger", "MergerRun", "MergerFailedError"]

log = logging.getLogger("memforest_gpu")


class MergerFailedError(ValueError):
    """An LLM merger failed on every request of a round (server down, bad key): the run
    stopped after it. ``journaled``: the merges kept in the journal at ``path`` (``None``:
    the run kept no journal)."""

    def __init__(self, merger: str, round: int, error: str, journaled: int = 0, path: str | None = None):
        self.merger, self.round, self.error, self.journaled, self.path = merger, round, error, journaled, path
        super().__init__(self.message("resume=True"))

    def __reduce__(self):  # travels between ranks (memforest_gpu.distributed.ranks)
        return type(self), (self.merger, self.round, self.error, self.journaled, self.path)

    def message(self, resume: str) -> str:
        """The message, naming the option that resumes the run ``resume``."""
        where = "" if self.path is None else (f"; the {self.journaled} merges before it are journaled in "
                                              f"{self.path!r}, rerun with {resume} once it is fixed")
        return f"the {self.merger} merger failed on every request of round {self.round}: {self.error}; stopped{where}"


def resolve_merger(merger, merger_options: dict | None):
    """A merger object from a name (with ``merger_options``) or the object itself."""
    if isinstance(merger, str):
        return get_merger(merger, **(merger_options or {}))
    if merger_options:
        raise ValueError(f"merger_options must be empty when merger is an object, got {sorted(merger_options)}")
    return merger


def run_locked(src, dst, run: Callable, *, merger="extractive", merger_options: dict | None = None,
               format: str | None = None, out_format: str | None = None, journal: bool = True,
               parts: bool = False):
    """``run(src, dst, merger)`` after the checks that need nothing loaded, with ``dst``'s
    folder made and its lock held (``OUT.lock``; a second run is refused)."""
    src, dst = os.fspath(src), os.fspath(dst)
    preflight(src, dst, format=format, out_format=out_format, journal=journal, parts=parts)
    merger = resolve_merger(merger, merger_options)
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)  # the journal lives there from the start
    with OutputLock(dst):
        return run(src, dst, merger)


class MergerRun:
    """A run's merger and its journal (``journal``: kept at ``dst + ".journal.jsonl"``; rank
    ``rank`` of a distributed run keeps ``OUT.rankR.journal.jsonl``, with ``more`` in its
    fingerprint, see :func:`~.journal.run_fingerprint`). A journal left by an interrupted run
    is refused unless ``resume`` (:class:`~.journal.JournalExistsError`, before anything is
    loaded); ``resume`` with nothing to resume (no journal, no parts folder) says so in one
    warning and runs from the start. ``merger`` ``None``: the engine's default (the extractive
    merger)."""

    def __init__(self, src: str | None, dst: str | None, config, merger, *, journal: bool = True,
                 resume: bool = False, rank: int | None = None, more: dict | None = None):
        self.src, self.config, self.merger, self.resume, self.more = src, config, merger, resume, more or {}
        self.path = journal_path(dst, rank) if journal else None
        if self.path is not None and os.path.exists(self.path) and not resume:
            raise JournalExistsError(self.path)
        if resume and rank is None and self.path is not None and not os.path.exists(self.path) and \
                not os.path.exists(parts_dir(dst)):
            log.warning("{resume}: no journal of an interrupted run at %r: nothing to resume, "
                        "starting from the beginning", self.path)
        self.journal: JournaledMerger | None = None
        self.started = False

    def open(self, emb) -> None:
        """Open the journal now (its fingerprint names the embedder ``emb``): a journal of
        another run is refused here. :meth:`compress` opens it when this was not called."""
        if self.path is not None and self.journal is None:
            fp = run_fingerprint(self.src, self.config, self.merger, emb.name if emb is not None else MEAN_EMBEDDER,
                                 **self.more)
            self.journal = JournaledMerger(self.merger, self.path, fingerprint=fp, resume=self.resume)

    def _start(self, emb) -> None:
        self.open(emb)
        load = getattr(self.merger, "load", None)
        if callable(load):
            load()  # a model that cannot load fails here, not as fallbacks inside the engine
        self.started = True

    def compress(self, store, emb, *, device=None, progress: bool = False, **engine) -> CompressResult:
        """Compress ``store`` (its vectors reused for the output's) with the run's merger and
        journal; ``engine``: more arguments of :func:`~memforest_gpu.engine.compress` (a
        distributed rank's ``partition`` and ``quotas``)."""
        if not self.started:
            self._start(emb)
        # a file run drops its input after the run: the engine may write over the input's vectors
        memory = MemoryPlan.from_environment(overwrite_input=True)
        return compress(store, self.config, merger=self.journal or self.merger, embedder=emb, device=device,
                        progress=progress, on_round=self._stop_if_broken, memory=memory, **engine)

    def _stop_if_broken(self, rnd: int, merges: list) -> None:
        err = getattr(self.merger, "fatal", None)
        if err:
            n = self.journal.stats["journaled"] if self.journal is not None else 0
            raise MergerFailedError(self.merger.name, rnd, err, n, self.path)

    def journaled(self) -> int:
        """The merges the journal holds: resumed with, plus appended since."""
        return len(self.journal.done) if self.journal is not None else 0

    def interrupted(self, before: str = "any merge was journaled") -> RunInterrupted:
        """What Ctrl-C during the run raises: the merges the journal kept (a run to resume), or
        that nothing was written (no journal, or ``before`` its first merge)."""
        if self.path is None:
            return RunInterrupted("interrupted; nothing was written")
        n = self.journaled()
        if n:
            return RunInterrupted(f"interrupted; {n} merges are journaled in {self.path!r}", resumable=True)
        return RunInterrupted(f"interrupted before {before}; nothing was written")

    def replayed(self) -> int:
        """The merges taken from the journal so far (not sent to the merger)."""
        return self.journal.stats["replayed"] if self.journal is not None else 0

    def close(self) -> None:
        if self.journal is not None:
            self.journal.close()

    def finish(self) -> None:
        """The output is written: the journal goes (the merger's ``stats["replayed"]`` says how
        many merges it gave back)."""
        if self.journal is not None:
            self.journal.finish()
            if isinstance(getattr(self.merger, "stats", None), dict):
                self.merger.stats["replayed"] = self.journal.stats["replayed"]
        elif self.path is not None and os.path.exists(self.path):
            os.unlink(self.path)  # a resumed run that found every part done: its journal is not needed
