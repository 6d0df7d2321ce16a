"""Our batched engine against the straightforward pipeline, for speed.

The reference is numpy k-means (bench/reference_pipeline.py) plus the plain-Python merge
order of memforest_gpu/engine/reference.py on our partition (mean embeddings, no text merger, no
token cap); its k-means is timed separately, so the speed ratio covers the whole pipeline:
partition + trees + merging. That both make the same merges is asserted by
tests/test_merge_order.py, not here.

    python bench/versus_reference.py --sizes 1000,2000,5000,10000 --out runs/versus.json
    python bench/versus_reference.py --sizes 10000 --ratio 0.3 --schedules matching,sequential --repeat 3
    python bench/versus_reference.py ... --threads 1     # one torch thread: steadier on a shared machine
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import Timer, print_hardware, write_records  # noqa: E402
from reference_pipeline import n_clusters, numpy_kmeans  # noqa: E402

from memforest_gpu import CompressConfig, compress  # noqa: E402
from memforest_gpu.engine.partition import partition_nodes  # noqa: E402
from memforest_gpu.engine.reference import reference_compress  # noqa: E402
from memforest_gpu.store.synthetic import synthetic_store  # noqa: E402


class _NullMerger:
    """Text is not what this benchmark measures: merged text = older text."""

    name = "null"

    def merge(self, pairs):
        return [p.older.text for p in pairs]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,2000,5000,10000")
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--ratio", type=float, default=0.5)
    ap.add_argument("--schedules", default="sequential", help="comma-separated: sequential, matching")
    ap.add_argument("--repeat", type=int, default=1, help="our runs (the best kept; the reference runs once)")
    ap.add_argument("--out", default="runs/versus_reference.json")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch CPU threads (default 0: torch's; 1 is steadier on a shared machine)")
    a = ap.parse_args(argv)
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    print_hardware()
    records = []
    for n in [int(x) for x in a.sizes.split(",")]:
        for schedule in a.schedules.split(","):
            records.append(_one(n, schedule, a))
    write_records(a.out, records)


def _one(n: int, schedule: str, a) -> dict:
    store = synthetic_store(n, dim=a.dim, seed=n)
    paper = CompressConfig.preset("paper")  # the authors' pipeline: the paper's partition and trees
    cfg = dataclasses.replace(paper, merge=dataclasses.replace(paper.merge, ratio=a.ratio, schedule=schedule))
    compress(synthetic_store(200, dim=a.dim, seed=1), cfg, merger=_NullMerger())  # warm-up
    best = None
    for _ in range(max(1, a.repeat)):
        with Timer() as ours:
            res = compress(store, cfg, merger=_NullMerger())
        best = ours.seconds if best is None else min(best, ours.seconds)
    # same partition for the reference (its quotas follow the same rules)
    names, codes = store.tenant_index()
    part = partition_nodes(store.embeddings, store.timestamps, codes, names, cfg.partition)
    tree_of = part.tree.cpu().numpy()
    X = store.embeddings.cpu().numpy()
    with Timer() as ref_km:
        numpy_kmeans(X, n_clusters(n, cfg.partition.alpha), iters=cfg.partition.max_iter)
    with Timer() as ref_merge:
        ref = reference_compress(store, cfg, _NullMerger(), tree=tree_of.tolist())
    ref_total = ref_km.seconds + ref_merge.seconds
    rec = {"bench": "versus_reference", "n": n, "dim": a.dim, "ratio": a.ratio, "schedule": schedule,
           "ours_s": best, "ref_kmeans_s": ref_km.seconds, "ref_merge_s": ref_merge.seconds,
           "ref_total_s": ref_total, "speedup": ref_total / best, "trees": int(part.tree_tenant.shape[0]),
           "merges": len(res.merges), "ref_merges": len(ref.merges)}
    print(f"n={n:>7} {schedule:>10} ours {best:7.2f}s  reference {ref_total:8.2f}s "
          f"(kmeans {ref_km.seconds:.2f}s + merging {ref_merge.seconds:.2f}s)  speedup {rec['speedup']:6.1f}x",
          flush=True)
    return rec


if __name__ == "__main__":
    main()
