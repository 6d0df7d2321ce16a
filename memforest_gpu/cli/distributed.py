"""The command line of ``torchrun --nproc-per-node N -m memforest_gpu.distributed compress IN OUT``
(``python -m memforest_gpu.distributed compress ...`` runs it as one rank): its flags, their
checks, and what rank 0 prints. Each flag maps to a config field, as in ``memforest compress``.

The ranks themselves (their GPUs, their process group, the run) are the library's
(:mod:`memforest_gpu.distributed.launch`): its ``__main__`` hands :func:`main` the function
that runs this process as one rank, so the command line never imports the library's
distributed package.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable

from ..mergers import MissingOptionError, get_merger
from ..runs.errors import OPTION_WORDS
from ..runs.preflight import preflight
from ..store.atomic import atomic_write_text
from .flags import add_config_arguments, check_embedder_flag, config_from_args, parse_options
from .path_checks import need_input, need_writable
from .report_text import format_report
from .run_notes import show_notes
from .running import CLI_NAMES, error_message, interrupted_message

__all__ = ["main", "build_parser", "check"]

PROG = "memforest_gpu.distributed"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="torchrun --nproc-per-node N -m memforest_gpu.distributed",
                                 description="Compress one memory store with several processes (one per GPU).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compress", help="compress IN into OUT; rank 0 writes OUT")
    c.add_argument("input")
    c.add_argument("output")
    add_config_arguments(c, two_level=False)  # split tenants run the sharded exact k-means
    c.add_argument("--embedder", default="auto", help="auto | default | none | PATH (as in memforest compress)")
    c.add_argument("--merger", default="extractive", help="merger name (each rank builds its own)")
    c.add_argument("--merger-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of the merger, e.g. model=/models/qwen (VALUE read as JSON when it parses)")
    c.add_argument("--device", default=None, help="cpu | cuda (default: cuda when present)")
    c.add_argument("--backend", default="auto", help="auto (nccl on CUDA, else gloo) | nccl | gloo")
    c.add_argument("--no-pin-gpu", action="store_true",
                   help="do not restrict each rank to GPU LOCAL_RANK (CUDA_VISIBLE_DEVICES)")
    c.add_argument("--split-above", type=int, default=None,
                   help="spread the trees of tenants larger than this over ranks (default: tenants whose cost "
                        "alone exceeds a fair share)")
    c.add_argument("--format", default=None, help="input format: parquet | jsonl (default: from the suffix)")
    c.add_argument("--out-format", default=None, help="output format (default: from the suffix)")
    c.add_argument("--report", default=None, help="also write the run report (with the per-rank plan) as JSON")
    c.add_argument("--resume", action="store_true",
                   help="continue an interrupted run from each rank's OUTPUT.rankR.journal.jsonl without redoing "
                        "its merges (same input, options and number of ranks)")
    c.add_argument("--quiet", action="store_true", help="no progress bars, no note of a slow model load")
    return ap


def check(a) -> None:
    """Every check that needs nothing loaded: the config's flags, the merger's options, the
    embedder's value, the files read and written (the backend's: when the ranks start)."""
    config_from_args(a)
    parse_options(a.merger_option)
    check_embedder_flag(a.embedder)
    need_input(a.input)
    need_writable("OUTPUT", a.output)
    need_writable("--report", a.report)


def _say(res, place, a) -> None:
    """Rank 0: the report, what was resumed and spread, the ranks' shares; ``--report``."""
    print(format_report(res.report))
    if res.replayed:
        print(f"resumed: {res.replayed} merges replayed from the ranks' journals (not sent to the mergers)")
    if res.split:
        print(f"trees of {len(res.split)} tenant(s) spread over ranks: {', '.join(res.split[:5])}"
              + (" ..." if len(res.split) > 5 else ""))
    print(f"{place.world} rank(s), backend {place.backend}: "
          + ", ".join(f"rank {r} {len(p)} item(s)" for r, p in enumerate(res.plan)))
    print(f"wrote {a.output}")
    if a.report:
        d = res.report.to_dict()
        d["plan"], d["split"] = res.plan, res.split
        atomic_write_text(a.report, json.dumps(d, indent=2, default=str))


def _run(a, run_ranks: Callable) -> int:
    cfg = config_from_args(a)
    options = parse_options(a.merger_option)
    try:
        merger = get_merger(a.merger, **options)  # bad names and options fail here, on every rank
    except MissingOptionError as e:  # this command takes a merger's options as --merger-option pairs
        raise ValueError(e.message(f"--merger-option {e.missing[0]}=...")) from None
    # the output never overwrites the input, and a bad target fails before any work
    preflight(a.input, a.output, format=a.format, out_format=a.out_format, report=a.report,
              lock=False, journal=False, names=CLI_NAMES)  # rank 0 writes OUTPUT whole at the end
    res, place = run_ranks(a.input, a.output, cfg, backend=a.backend, device=a.device, pin=not a.no_pin_gpu,
                           merger=merger, embedder=a.embedder, split_above=a.split_above, format=a.format,
                           out_format=a.out_format, resume=a.resume,
                           progress=not a.quiet and os.environ.get("RANK", "0") == "0" and sys.stderr.isatty())
    if place.rank == 0:
        _say(res, place, a)
    return 0


def main(argv: list[str] | None = None, *, run_ranks: Callable) -> int:
    """Parse, check and run the command; ``run_ranks(input, output, config, *, backend, device,
    pin, **options) -> (result, place)`` runs this process as one rank (errors name the rank
    when there are several, from torchrun's ``RANK`` and ``WORLD_SIZE``)."""
    a = build_parser().parse_args(argv)
    many = int(os.environ.get("WORLD_SIZE", "1")) > 1
    where = f"[rank {os.environ.get('RANK', '0')}] " if many else ""
    show_notes(quiet=a.quiet or os.environ.get("RANK", "0") != "0")  # rank 0 says a slow model load
    with OPTION_WORDS.as_command():  # warnings name the options as flags
        try:
            check(a)
            return _run(a, run_ranks)
        except (ValueError, OSError, ImportError, RuntimeError) as e:
            print(f"{where}{PROG} {a.cmd}: error: {error_message(e)}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as e:  # Ctrl-C: what this rank kept, how to resume, no traceback
            print(f"{where}{PROG} {a.cmd}: {interrupted_message(e)}", file=sys.stderr)
            return 130
