"""Compressing a store file in memory: checks before any work, the output's lock, the merge
journal, and Ctrl-C that says how to resume (:mod:`.budgeted` is the same for a store bigger
than memory)."""
from __future__ import annotations

from pathlib import Path

from ..config import CompressConfig
from ..engine import CompressResult, DryRunResult, dry_run
from ..store.io import write_store
from .driver import MergerRun, run_locked
from .loading import load_store_and_embedder

__all__ = ["compress_in_memory", "dry_run_file"]


def compress_in_memory(src: str | Path, dst: str | Path, config: CompressConfig, *, embedder: str = "auto",
                       merger="extractive", merger_options: dict | None = None, device=None, progress: bool = True,
                       format: str | None = None, out_format: str | None = None, resume: bool = False,
                       journal: bool = True) -> CompressResult:
    """Read ``src``, compress, write ``dst`` atomically.

    ``merger``: a name for :func:`~memforest_gpu.mergers.get_merger` (with
    ``merger_options``) or a merger object (its ``stats`` then hold the LLM counters and,
    on a resumed run, ``replayed``: the merges taken from the journal).

    With ``journal`` (default) every finished merge is appended to ``dst + ".journal.jsonl"``;
    the journal is deleted once ``dst`` is written. After a crash, ``resume=True``
    continues from it (see :mod:`memforest_gpu.runs.journal`); without ``resume`` an existing
    journal is an error. ``dst`` itself is only ever written whole, at the end.

    An LLM merger whose every request of a round failed (server down, bad key) stops the run
    after that round with a :class:`~memforest_gpu.runs.driver.MergerFailedError` (a
    ``ValueError``); the merges made so far stay journaled. A journal
    that cannot be written stops the run with :class:`~memforest_gpu.runs.journal.JournalWriteError`
    (never a merger fallback).

    Before anything is loaded, ``src`` and ``dst`` are checked
    (:func:`~memforest_gpu.runs.preflight.preflight`: ``dst`` not ``src`` or a link to it, a
    known format, not a directory, a writable folder) and
    ``dst``'s folder created; while the run writes ``dst`` it holds ``dst + ".lock"``
    (:class:`~memforest_gpu.runs.outputs.OutputLock`: a second run is refused). Ctrl-C raises
    :class:`~.loading.RunInterrupted` whose message says how many merges are journaled.
    """
    def run(src: str, dst: str, merger) -> CompressResult:
        return _compress_locked(src, dst, config, embedder=embedder, merger=merger, device=device,
                                progress=progress, format=format, out_format=out_format, resume=resume,
                                journal=journal)

    return run_locked(src, dst, run, merger=merger, merger_options=merger_options, format=format,
                      out_format=out_format, journal=journal)


def _compress_locked(src, dst, config, *, embedder, merger, device, progress, format, out_format, resume,
                     journal) -> CompressResult:
    run = MergerRun(src, dst, config, merger, journal=journal, resume=resume)
    store, emb = load_store_and_embedder(src, embedder=embedder, device=device, format=format)
    try:
        result = run.compress(store, emb, device=device, progress=progress)  # the output's vectors reuse the store's
        write_store(result.store, dst, format=out_format, time_format=store.time_format)
    except KeyboardInterrupt:
        raise run.interrupted() from None
    finally:
        run.close()
    run.finish()
    return result


def dry_run_file(src: str | Path, config: CompressConfig, *, embedder: str = "auto", device=None,
                 format: str | None = None) -> DryRunResult:
    """A dry run: the first round's planned merges (``result.merges``: tenant, a, b,
    similarity; ``result.pairs``: their texts). Merges nothing and writes nothing."""
    store, emb = load_store_and_embedder(src, embedder=embedder, device=device, format=format)
    return dry_run(store, config, embedder=emb, device=device)
