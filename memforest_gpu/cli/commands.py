"""``memforest``: the parser of every command, and :func:`main`, which checks a command's flags
and paths and then runs it.

Building the parser and checking the flags import light modules only (argparse, the configs,
each command's ``*_args`` module), so ``--help`` and a usage error answer at once. The module
that runs a command, which loads torch and the store code, is imported only once its checks
have passed: :data:`RUNNERS` names it and :func:`runner` is the one place that imports it.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from ..printable import printable
from . import adapters_args, compact_args, compress_args, demo_args, eval_args, review_args, search_args
from .parser import HelpFormatter, Parser, check_usage  # noqa: F401 (HelpFormatter: re-exported)
from .run_notes import show_notes

__all__ = ["main", "build_parser", "printable", "runner", "RUNNERS", "CHECKS"]

#: command -> the module that runs it (its ``run(args)``), imported when the command runs
RUNNERS = {
    "compress": "memforest_gpu.cli.compress",
    "search": "memforest_gpu.cli.search",
    "info": "memforest_gpu.cli.info",
    "demo": "memforest_gpu.cli.demo",
    "compact": "memforest_gpu.cli.compact",
    "mem0": "memforest_gpu.cli.adapters",
    "graph": "memforest_gpu.cli.adapters",
    "eval": "memforest_gpu.cli.eval",
    "review": "memforest_gpu.cli.review",
}
#: command -> its checks that need nothing loaded (flags, numbers, the files it reads and writes)
CHECKS = {
    "compress": compress_args.check, "search": search_args.check_search, "info": search_args.check_info,
    "demo": demo_args.check, "compact": compact_args.check, "mem0": adapters_args.check,
    "graph": adapters_args.check, "eval": eval_args.check, "review": review_args.check,
}


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog="memforest", description="Compress and search LLM-agent memory stores.")
    ap.add_argument("-v", "--verbose", action="store_true", help="log more")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    compress_args.add_parser(sub)  # compress
    search_args.add_search_parser(sub)  # search
    search_args.add_info_parser(sub)  # info
    demo_args.add_parser(sub)  # demo
    compact_args.add_parser(sub)  # compact
    adapters_args.add_parser(sub)  # mem0 compress|compact|restore, graph compress
    eval_args.add_parser(sub)  # eval
    review_args.add_parser(sub)  # review
    return ap


def runner(cmd: str):
    """The module that runs ``cmd``: the one import the command line defers until a command
    has passed its checks."""
    return importlib.import_module(RUNNERS[cmd])


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s: %(message)s")
    show_notes(quiet=getattr(args, "quiet", False))
    if not check_usage(args, CHECKS[args.cmd]):
        return 2
    return runner(args.cmd).run(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
