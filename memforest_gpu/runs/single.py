"""Compressing a store file in memory: checks before any work, the output's lock, the merge
journal, and Ctrl-C that says how to resume (:mod:`.budgeted` is the same for a store bigger
than memory)."""
from __future__ import annotations

import os
from pathlib import Path

from ..config import CompressConfig
from ..engine import CompressResult, DryRunResult, compress, dry_run
from ..mergers import get_merger
from ..mergers.embedders import MEAN_EMBEDDER
from ..store.io import detect_format, write_store
from .journal import JournaledMerger, journal_path, run_fingerprint
from .loading import RunInterrupted, load_store_and_embedder
from .outputs import OutputLock, check_output
from .paths import check_paths, output_files, reads

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
    after that round with a ``ValueError``; the merges made so far stay journaled. A journal
    that cannot be written stops the run with :class:`~memforest_gpu.runs.journal.JournalWriteError`
    (never a merger fallback).

    Before anything is loaded, ``dst`` is checked (:func:`~memforest_gpu.runs.outputs.check_output`:
    not ``src`` or a link to it, a known format, not a directory, a writable folder) and its
    folder created; while the run writes ``dst`` it holds ``dst + ".lock"``
    (:class:`~memforest_gpu.runs.outputs.OutputLock`: a second run is refused). Ctrl-C raises
    :class:`RunInterrupted` whose message says how many merges are journaled.
    """
    src, dst = os.fspath(src), os.fspath(dst)
    # everything that can be checked without loading is checked first; nothing is left behind
    detect_format(src, format)
    if not os.path.exists(src):
        raise FileNotFoundError(f"memory store file not found: {src!r}")
    check_paths(reads("INPUT", src), output_files("OUTPUT", dst, journal=journal))
    check_output(dst, format=out_format, inputs=[src], format_flag="out_format")
    if isinstance(merger, str):
        merger = get_merger(merger, **(merger_options or {}))
    elif merger_options:
        raise ValueError(f"merger_options must be empty when merger is an object, got {sorted(merger_options)}")
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)  # the journal lives there from the start
    with OutputLock(dst):
        return _compress_locked(src, dst, config, embedder=embedder, merger=merger, device=device,
                                progress=progress, format=format, out_format=out_format, resume=resume,
                                journal=journal)


def _compress_locked(src, dst, config, *, embedder, merger, device, progress, format, out_format, resume,
                     journal) -> CompressResult:
    store, emb = load_store_and_embedder(src, embedder=embedder, device=device, format=format)
    run_merger = merger
    if journal:
        fp = run_fingerprint(src, config, merger, emb.name if emb is not None else MEAN_EMBEDDER)
        run_merger = JournaledMerger(merger, journal_path(dst), fingerprint=fp, resume=resume)
    load = getattr(merger, "load", None)
    if callable(load):
        load()  # a model that cannot load fails here, not as fallbacks inside the engine

    def stop_if_broken(rnd: int, merges: list) -> None:
        err = getattr(merger, "fatal", None)
        if err:
            where = f"; the {run_merger.stats['journaled']} merges before it are journaled in " \
                    f"{run_merger.path!r}, rerun with --resume once it is fixed" if journal else ""
            raise ValueError(f"the {merger.name} merger failed on every request of round {rnd}: {err}; "
                             f"stopped{where}")

    try:
        result = compress(store, config, merger=run_merger, embedder=emb, device=device, progress=progress,
                          on_round=stop_if_broken, copy=False)  # the output's vectors reuse the store's
        write_store(result.store, dst, format=out_format, time_format=store.time_format)
    except KeyboardInterrupt:
        if not journal:
            raise RunInterrupted("interrupted; nothing was written") from None
        n = len(run_merger.done)  # the merges the journal holds: resumed with, plus appended since
        if n:
            raise RunInterrupted(f"interrupted; {n} merges are journaled in {run_merger.path!r}: rerun the same "
                                 "command with --resume to continue from them") from None
        raise RunInterrupted("interrupted before any merge was journaled; nothing was written") from None
    finally:
        if journal:
            run_merger.close()
    if journal:
        run_merger.finish()
        if isinstance(getattr(merger, "stats", None), dict):
            merger.stats["replayed"] = run_merger.stats["replayed"]
    return result


def dry_run_file(src: str | Path, config: CompressConfig, *, embedder: str = "auto", device=None,
                 format: str | None = None) -> DryRunResult:
    """A dry run: the first round's planned merges (``result.merges``: tenant, a, b,
    similarity; ``result.pairs``: their texts). Merges nothing and writes nothing."""
    store, emb = load_store_and_embedder(src, embedder=embedder, device=device, format=format)
    return dry_run(store, config, embedder=emb, device=device)
