"""A distributed run of a store file: the single run's driver (:mod:`memforest_gpu.runs.driver`)
on every rank.

Every rank runs the same preflight, reads the input, and compresses its share with its own
merger behind its own journal (:class:`~memforest_gpu.runs.driver.MergerRun`, kept at
``OUT.rankR.journal.jsonl``: one file per rank, since each rank merges other pairs, and a
rank on another machine writes its own disk). Rank 0 writes the output; then every rank
deletes its journal. After an interruption or a failed merger, ``resume=True`` continues:
each rank replays its journal, so no journaled pair is sent to a merger again. A journal is
only resumed by a run with the same input, config, merger, embedder, number of ranks and
``split_above`` (they decide which pairs each rank merges).

A step that may fail on one rank alone (a journal, a merger, rank 0's write) fails on every
rank (:func:`~.ranks.all_ranks`), so no rank is left waiting for the others.
"""
from __future__ import annotations

import os

from ..runs.driver import MergerRun, resolve_merger
from ..runs.journal import JournalExistsError, journal_path
from ..runs.loading import load_store_and_embedder
from ..runs.paths import writes
from ..runs.preflight import preflight
from ..store.io import write_store
from .ranks import all_ranks, any_rank, world_of
from .runner import DistributedResult, compress_distributed

__all__ = ["compress_file_distributed"]


def compress_file_distributed(src, dst, config, *, merger="extractive", merger_options: dict | None = None,
                              embedder: str = "auto", device=None, split_above: int | None = None,
                              format: str | None = None, out_format: str | None = None, resume: bool = False,
                              journal: bool = True, progress: bool = False, group=None) -> DistributedResult | None:
    """Read ``src`` on every rank of ``group``, compress it together
    (:func:`~.runner.compress_distributed`) and write ``dst`` from rank 0 (atomically). Returns
    the result on rank 0, ``None`` on the others.

    ``merger``: a name (with ``merger_options``), or a merger object made by each rank.
    ``journal`` (default): each rank journals its merges at ``OUT.rankR.journal.jsonl``, deleted
    once ``dst`` is written; a journal left by an interrupted run is refused unless ``resume``
    (:class:`~memforest_gpu.runs.journal.JournalExistsError`, on every rank, before any work).
    Ctrl-C raises :class:`~memforest_gpu.runs.loading.RunInterrupted` saying what this rank
    journaled.
    """
    src, dst = os.fspath(src), os.fspath(dst)
    rank, world = world_of(group)
    # the output never overwrites the input, and a bad target fails before any work; no lock: rank 0
    # writes OUTPUT whole at the end
    mine = writes(f"the merge journal of OUTPUT ({os.path.basename(journal_path(dst, rank))})",
                  journal_path(dst, rank)) if journal else []
    preflight(src, dst, format=format, out_format=out_format, lock=False, journal=False, others=(mine,))
    merger = resolve_merger(merger, merger_options)  # bad names and options fail here, on every rank
    left = any_rank(journal and not resume and os.path.exists(journal_path(dst, rank)), group)
    if any(left):
        raise JournalExistsError(journal_path(dst, left.index(True)))
    if journal:
        os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    run = MergerRun(src, dst, config, merger, journal=journal, resume=resume, rank=rank,
                    more={"ranks": world, "split_above": split_above})
    store, emb = load_store_and_embedder(src, embedder=embedder, device=device, format=format)
    all_ranks(lambda: run.open(emb), group)  # a journal of another run is refused on every rank
    try:
        res = compress_distributed(store, config, embedder=emb, device=device, split_above=split_above,
                                   group=group, progress=progress, run=run)

        def write() -> None:
            if rank == 0:
                write_store(res.store, dst, format=out_format)

        all_ranks(write, group)  # the journals stay until the output is written
    except KeyboardInterrupt:
        raise run.interrupted("this rank journaled a merge") from None
    finally:
        run.close()
    run.finish()
    return res
