"""The flags of ``memforest mem0 compress|compact|restore`` and ``memforest graph compress``
and their checks before anything loads (the runs: :mod:`.adapters`)."""
from __future__ import annotations

import argparse

from .compact_args import add_limit_arguments, limits_from_args
from .flags import add_config_arguments, check_embedder_flag, config_from_args, parse_options
from .path_checks import need_input, need_writable
from .review_args import add_review_argument, check_review_path

__all__ = ["add_parser", "check", "m3_vectors"]


def m3_vectors(value: str) -> int | str:
    """``--m3-vectors``: an integer >= 1, ``auto`` or ``all``."""
    v = value.strip().lower()
    if v in ("auto", "all"):
        return v
    try:
        n = int(v)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, 'auto' or 'all', got {value!r}")
    return n


def _add_compress_options(p) -> None:
    add_config_arguments(p)
    p.add_argument("--merger", default="extractive", help="who writes merged text (see memforest compress)")
    p.add_argument("--merger-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an option of the merger, e.g. model=/models/qwen (VALUE read as JSON when it parses)")
    p.add_argument("--device", default=None, help="cpu | cuda (default: cuda when present)")
    p.add_argument("--report", default=None, help="also write the run report as JSON to this path")
    p.add_argument("--quiet", action="store_true", help="no progress bars, no note of a slow model load")
    add_review_argument(p)


def _add_write_path(p) -> None:
    p.add_argument("--write-path", choices=["batch", "mem0"], default="batch",
                   help="batch: Mem0's writes (payloads, history, entity links) in batches through its own storage "
                        "objects (default); mem0: Memory.add / Memory.delete one memory at a time (the reference)")


def add_parser(subparsers) -> None:
    """Add the ``mem0`` and ``graph`` commands to a ``memforest`` subparsers object."""
    m = subparsers.add_parser("mem0", help="compress a Mem0 store in place, or restore it from a backup")
    ms = m.add_subparsers(dest="sub", required=True)
    c = ms.add_parser("compress", help="back up a scope, add merged memories, then delete the ones they replace")
    c.add_argument("--config", required=True, help="Mem0 config (YAML or JSON), as given to Memory.from_config")
    c.add_argument("--user-id", default=None, help="compress this user's memories")
    c.add_argument("--agent-id", default=None, help="compress this agent's memories")
    c.add_argument("--run-id", default=None, help="compress this run's memories")
    c.add_argument("--all-tenants", action="store_true", help="every memory of the collection")
    c.add_argument("--dry-run", action="store_true",
                   help="compress in memory (the merger is called) and print which memories would merge, with "
                        "previews; write and delete nothing")
    c.add_argument("--backup", default=None, help="backup file (default mem0-backup-<scope>-<time>.parquet)")
    c.add_argument("--show", type=int, default=50, help="merged memories shown in the plan (default 50)")
    _add_write_path(c)
    _add_compress_options(c)
    k = ms.add_parser("compact", help="keep every user within a budget: merge the memories of users over it")
    k.add_argument("--config", required=True, help="Mem0 config (YAML or JSON), as given to Memory.from_config")

    add_limit_arguments(k, flag="--max-per-user", what="user")
    k.add_argument("--state", default=None,
                   help="the compaction state (trees per memory; default CONFIG.compact.json beside the config)")
    k.add_argument("--user-id", default=None, help="only this user's memories")
    k.add_argument("--agent-id", default=None, help="only this agent's memories")
    k.add_argument("--run-id", default=None, help="only this run's memories")
    k.add_argument("--dry-run", action="store_true", help="print which memories would merge; change nothing")
    k.add_argument("--backup", default=None, help="backup file (default mem0-backup-<scope>-<time>.parquet)")
    k.add_argument("--show", type=int, default=50, help="merged memories shown in the plan (default 50)")
    _add_write_path(k)
    _add_compress_options(k)
    r = ms.add_parser("restore", help="put a scope back exactly as in a backup")
    r.add_argument("backup", help="the backup file written by mem0 compress")
    r.add_argument("--config", required=True, help="Mem0 config (YAML or JSON)")

    g = subparsers.add_parser("graph", help="compress the text nodes of a graph memory (M3-Agent style)")
    gs = g.add_subparsers(dest="sub", required=True)
    gc = gs.add_parser("compress", help="merge text nodes; merged nodes inherit every edge (weights summed)")
    gc.add_argument("input", help="the graph to compress (Parquet or JSONL)")
    gc.add_argument("output", help="the compressed graph to write (a new path; never the input)")
    gc.add_argument("--embedder", default="auto", help="auto | default | none | PATH (as in memforest compress)")
    gc.add_argument("--format", default=None,
                    help="input format: parquet | jsonl | m3-agent (a pickled M3-Agent VideoGraph; default: from the "
                         "suffix, .pkl / .pickle = m3-agent)")
    gc.add_argument("--out-format", default=None,
                    help="output format (default: from the suffix; an M3-Agent graph is written back as one)")
    gc.add_argument("--method", default="memforest", choices=["memforest", "streammeco"],
                    help="memforest (merge text nodes, default) | streammeco (the StreamMeCo baseline: prune text "
                         "nodes, docs/evaluation.md)")
    gc.add_argument("--m3-vectors", type=m3_vectors, default="auto", metavar="N|auto|all",
                    help="an M3-Agent graph: the most vectors a text node holds (a merged node's text vector and "
                         "keys, every node padded to one count); auto: the input's text vectors divided by the "
                         "output's text nodes, so the graph holds no more vectors than before (default); all: no "
                         "bound")
    _add_compress_options(gc)


def check(a) -> None:
    """The config's and the node limits' flags, the merger's options, the embedder's value, the
    files read and the folders written."""
    if a.cmd == "mem0" and a.sub == "restore":
        need_input(a.config, "Mem0 config")  # the backup is read once the config is (its errors first)
        return
    if a.cmd == "mem0" and a.sub == "compact":
        limits_from_args(a)
    config_from_args(a)
    parse_options(a.merger_option)
    check_review_path(a.review)
    need_writable("--report", a.report)
    if a.cmd == "mem0":
        need_input(a.config, "Mem0 config")
        need_writable("--backup", a.backup)
        return
    check_embedder_flag(a.embedder)
    need_input(a.input, "graph file")
    need_writable("OUTPUT", a.output)
