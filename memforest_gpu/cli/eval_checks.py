"""The checks of ``memforest eval``'s arguments before any work: its paths under the path rule
(:mod:`memforest_gpu.runs.paths`: what it reads, the benchmark and ``--loo-from``, and the files
it writes into ``--out``, ``--cache`` and ``--export``), its number lists, and the flags a mode
would ignore (the streaming replay's without ``--stream``, the grid's with it)."""
from __future__ import annotations

import argparse
import os

from ..runs.paths import check_paths, reads, writes
from .flags import check_number_lists, refuse_ignored

__all__ = ["check_eval_args", "check_eval_paths", "RATIOS", "STREAM_ONLY", "add_stream_arguments"]

RATIOS = "0.3,0.5,0.7"  # --ratios
STREAM_ONLY = {"budgets": "0.7,0.5,0.3", "low_water": 0.8, "no_full_reference": False, "rerun": False}

#: what ``eval`` may write into ``--out`` (results, the streaming replay, leave-one-out)
OUT_FILES = ("results.json", "per_question.npz", "results.md", "retention.png", "stream.json", "stream.md",
             "loo.md", "loo.json", "loo_scores.npz")
BENCHMARK_FILES = ("nodes.jsonl", "nodes.parquet", "nodes.json", "questions.jsonl")
EXPORT_FILES = ("nodes.jsonl", "questions.jsonl")  # what --export writes


def _inside(what: str, folder, names, *, write: bool) -> list:
    if folder is None:
        return []
    role = writes if write else reads
    return [r for name in names for r in role(f"{what}'s {name}", os.path.join(folder, name))]


def check_eval_paths(a) -> None:
    """Refuse, before any work, an ``eval`` whose written files are files it reads."""
    bench = a.benchmark
    bench_files = _inside("--benchmark", bench, BENCHMARK_FILES, write=False) if os.path.isdir(bench) \
        else reads("--benchmark", bench)
    loo_from = [r for x in (getattr(a, "loo_from", None) or "").split(",") if x for r in reads("--loo-from", x)]
    check_paths(bench_files, loo_from, reads("--contexts", getattr(a, "contexts", None)),
                writes("--out", a.out, folder=True), _inside("--out", a.out, OUT_FILES, write=True),
                writes("--cache", a.cache, folder=True),
                writes("--export", a.export, folder=True), _inside("--export", a.export, EXPORT_FILES, write=True))


def check_eval_args(a) -> None:
    """Every check of ``eval``'s arguments that needs no file read (see the module docstring)."""
    check_eval_paths(a)
    check_number_lists(a, {"ratios": float, "seeds": int, "budgets": float, "loo_alphas": float,
                           "loo_time_weights": float, "loo_size_weights": float})
    if a.stream:  # flags the streaming replay would ignore, and those only it reads
        refuse_ignored(a, {"nodes": "turns", "turns_per_node": 1, "ratios": RATIOS, "leave_one_out": False,
                           "contexts": None, "skip_missing_contexts": False, "tenants": None, "max_questions": None},
                       "does not apply to --stream (it replays the benchmark's nodes session by session to --budgets)")
    else:
        refuse_ignored(a, STREAM_ONLY, "applies only with --stream")


def add_stream_arguments(p: argparse.ArgumentParser) -> None:
    """``--stream`` and the flags of the streaming replay."""
    g = p.add_argument_group("streaming replay (evaluation/stream.py, docs/compaction.md)")
    g.add_argument("--stream", action="store_true",
                   help="replay the benchmark session by session, compacting every tenant to its budget after each "
                        "session; compare with one offline compress to the same size (default methods: "
                        "memforest:matching,tome,kmeans_prune)")
    g.add_argument("--budgets", default=STREAM_ONLY["budgets"],
                   help="--stream: budgets, fractions of each tenant's final size")
    g.add_argument("--low-water", type=float, default=STREAM_ONLY["low_water"],
                   help="--stream: a tenant over budget keeps LOW_WATER x budget")
    g.add_argument("--no-full-reference", action="store_true",
                   help="--stream: skip re-running compress on the whole store after every session")
    g.add_argument("--rerun", action="store_true",
                   help="--stream: also compress every memory so far, uncompressed, after every session")
