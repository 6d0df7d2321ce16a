"""One big tenant compressed as ONE tree (alpha 0): wall time, time per stage and peak
resident memory against the tenant's size (and the CPU seconds, a figure less bent by a
shared machine than the wall time), for the nearest-neighbour graph (and the dense
one where it fits). Synthetic memory-like store (dim 384), the memforest preset's tree and
schedule, extractive merger, merged vectors by mean (no embedder). Each size runs in a fresh
process so the peak is its own.

    python docs/studies/scripts/one_tree.py --sizes 20000,100000 [--graphs knn,dense] [--ratio 0.5]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import time


def one(n: int, graph: str, ratio: float, knn: int | None, threads: int) -> dict:
    import resource

    import torch

    from memforest_gpu import compress
    from memforest_gpu.config import CompressConfig, MergeConfig, PartitionConfig, preset
    from memforest_gpu.store.synthetic import synthetic_store

    torch.set_num_threads(threads)
    store = synthetic_store(n, tenants=1, dim=384, seed=n)
    m = preset("memforest")
    spanning = dataclasses.replace(m.spanning, graph=graph, **({"knn": knn} if knn else {}))
    cfg = CompressConfig(partition=PartitionConfig(alpha=0.0), spanning=spanning,
                         merge=MergeConfig(ratio=ratio, schedule=m.merge.schedule))
    before = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    res = compress(store, cfg, device="cpu")
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    peak = after.ru_maxrss
    return {"nodes": n, "graph": graph, "knn": spanning.knn if graph == "knn" else None, "ratio": ratio,
            "trees": res.report.trees, "rounds": res.report.rounds, "merges": res.report.merges,
            "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "seconds": {k: round(v, 1) for k,
                                                                          v in res.report.seconds.items()},
            "peak_rss_gb": round(peak / 2 ** 20, 2), "rss_before_gb": round(before.ru_maxrss / 2 ** 20,
                                                                            2), "threads": threads}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="20000,100000")
    ap.add_argument("--graphs", default="knn")
    ap.add_argument("--ratio", type=float, default=0.5)
    ap.add_argument("--knn", type=int, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: run one size in this process
    ap.add_argument("--out", default="runs/one_tree.json")
    a = ap.parse_args(argv)
    if a.one:
        n, graph = a.one.split(":")
        print(json.dumps(one(int(n), graph, a.ratio, a.knn, a.threads)), flush=True)
        return
    print(json.dumps({"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                      "threads": a.threads}), flush=True)
    rows = []
    for n in [int(x) for x in a.sizes.split(",")]:
        for graph in a.graphs.split(","):
            cmd = [sys.executable, __file__, "--one", f"{n}:{graph}", "--ratio", str(a.ratio),
                   "--threads", str(a.threads)] + (["--knn", str(a.knn)] if a.knn else [])
            out = subprocess.run(cmd, capture_output=True, text=True)
            line = out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else \
                json.dumps({"nodes": n, "graph": graph, "error": out.stderr.strip().splitlines()[-1:]})
            print(line, flush=True)
            rows.append(json.loads(line))
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
