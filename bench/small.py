"""A small store, many times: the engine's fixed costs (one tenant, 10,000 nodes by default).

    python bench/small.py                       # both schedules, 5 repeats, best and median
    python bench/compare.py REV_A REV_B -- python bench/small.py --repeats 3

``compress`` alone (the store built and a warm-up run first), the paper's config but for
the schedule and ``--ratio`` (0.3), a concatenating merger (text is not what this measures)
and mean embeddings. One JSON line per schedule: the best and the median of ``--repeats``
runs, and the median run's seconds per stage.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import print_hardware  # noqa: E402

from memforest_gpu import CompressConfig, compress  # noqa: E402
from memforest_gpu.store.synthetic import synthetic_store  # noqa: E402


class Concatenating:
    """Merged text = the two texts joined: the cheapest merger."""

    name = "concatenating"

    def merge(self, pairs):
        return [p.older.text + " " + p.newer.text for p in pairs]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--ratio", type=float, default=0.3)
    ap.add_argument("--schedules", default="matching,sequential")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (default 0: torch's)")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    print_hardware()
    store = synthetic_store(a.n, tenants=1, dim=a.dim, seed=7)
    for schedule in a.schedules.split(","):
        base = CompressConfig.preset("paper")
        cfg = dataclasses.replace(base, merge=dataclasses.replace(base.merge, ratio=a.ratio, schedule=schedule))
        compress(store, cfg, merger=Concatenating())  # warm-up
        runs = []
        for _ in range(a.repeats):
            t = time.perf_counter()
            res = compress(store, cfg, merger=Concatenating())
            runs.append((time.perf_counter() - t, res.report.seconds))
        runs.sort(key=lambda x: x[0])
        med = runs[len(runs) // 2]
        rec = {"bench": "small", "name": schedule, "n": a.n, "best_seconds": runs[0][0],
               "median_seconds": statistics.median(r[0] for r in runs), "stages": med[1],
               "rounds": res.report.rounds}
        print(f"# {schedule:<10} n={a.n}: best {runs[0][0]:.3f} s, median {rec['median_seconds']:.3f} s, "
              f"{res.report.rounds} rounds", flush=True)
        print(json.dumps(rec), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
