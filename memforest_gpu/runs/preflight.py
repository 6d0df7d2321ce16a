"""Checks before any work, for every run that reads a store file and writes another: the
path rule (:func:`~.paths.check_paths`: no file a run writes is one it reads or writes in
another role), the input's format and existence, and the outputs (:func:`~.outputs.check_output`:
a known format, a writable folder, not the input). The drivers (:mod:`.single`,
:mod:`.budgeted`, the distributed command) and the commands call :func:`preflight`; a
compaction, which rewrites its store in place, calls :func:`check_store`.

Messages name a run's options in the caller's words (:class:`Names`): the Python API's
parameter names by default; a command passes its flags.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..store.io import detect_format
from .outputs import check_output
from .paths import PathRole, check_paths, output_files, reads, store_files, writes

__all__ = ["Names", "API_NAMES", "preflight", "check_store"]


@dataclass(frozen=True)
class Names:
    """What messages call a run's options: the input's and output's format options, the
    output itself (in :func:`check_output`'s messages) and the report."""

    format: str | None = "format"  # None: the command has no such option (nothing to suggest)
    out_format: str = "out_format"
    output: str = "output"
    report: str = "report"


API_NAMES = Names()


def preflight(src, dst=None, *, format: str | None = None, out_format: str | None = None, report=None,
              others: tuple[list[PathRole], ...] = (), lock: bool = True, journal: bool = True, parts: bool = False,
              names: Names = API_NAMES, kind: str = "memory store file") -> tuple[str, str | None]:
    """Check a run of ``src`` into ``dst`` before anything is loaded; returns the input's and
    output's formats (``None`` without ``dst``: a dry run).

    In order: the path rule over the input, the output with the files a run writes beside it
    (``lock``: ``OUT.lock``, ``journal``: ``OUT.journal.jsonl``, ``parts``: ``OUT.parts/``),
    ``report`` and ``others``; the input's format and existence; the output (format,
    folder); the report's folder. Nothing is written. ``kind``: what a missing input is
    called (``graph file``).
    """
    src = os.fspath(src)
    outputs = [] if dst is None else output_files("OUTPUT", dst, lock=lock, journal=journal, parts=parts)
    check_paths(reads("INPUT", src), outputs, writes(names.report, report), *others)
    fmt = detect_format(src, format, flag=names.format)
    if not os.path.exists(src):
        raise FileNotFoundError(f"{kind} not found: {src!r}")
    out_fmt = None
    if dst is not None:
        out_fmt = check_output(dst, format=out_format, inputs=[src], format_flag=names.out_format, what=names.output)
    if report is not None:
        check_output(report, inputs=[src] + ([dst] if dst is not None else []), what=names.report,
                     needs_format=False)
    return fmt, out_fmt


def check_store(path, *, dry_run: bool = False, report=None, others: tuple[list[PathRole], ...] = (),
                names: Names = API_NAMES) -> str:
    """Check a run that rewrites the store ``path`` in place (``compact``): the path rule over
    the store and the files beside it (its inbox; unless ``dry_run``, its lock and journal),
    ``report`` and ``others``; the store's format and existence; unless ``dry_run``, its folder
    (it takes the lock, the journal and the new store). Returns the store's format."""
    path = os.fspath(path)
    check_paths(store_files(path, dry_run=dry_run), writes(names.report, report), *others)
    fmt = detect_format(path, None, flag=None)
    if not os.path.exists(path):
        raise FileNotFoundError(f"memory store file not found: {path!r}")
    if not dry_run:
        check_output(path, what="STORE")
    if report is not None:
        check_output(report, inputs=[path], what=names.report, needs_format=False)
    return fmt
