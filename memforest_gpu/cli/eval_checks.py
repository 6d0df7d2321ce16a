"""The paths of ``memforest eval`` under the path rule, checked before any work
(:mod:`memforest_gpu.runs.paths`: what it reads, the benchmark and ``--loo-from``, and the files
it writes into ``--out``, ``--cache`` and ``--export``); its flags' checks:
:mod:`.eval_args`."""
from __future__ import annotations

import os

from ..runs.paths import check_paths, reads, writes

__all__ = ["check_eval_paths"]

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
