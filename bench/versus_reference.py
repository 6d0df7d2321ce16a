"""Our batched engine against the straightforward pipeline (bench/reference_pipeline.py).

Both get the same partition (our k-means result) and the same per-tree quotas, merge with
mean embeddings (no text merger, no token cap), and must make the same merges. The
reference's own numpy k-means is timed separately, so the speed ratio covers the whole
pipeline: partition + trees + merging.

    python bench/versus_reference.py --sizes 1000,2000,5000,10000 --out runs/versus.json
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import Timer, print_hardware, write_records  # noqa: E402
from reference_pipeline import n_clusters, numpy_kmeans, reference_pipeline  # noqa: E402

from memforest_gpu import CompressConfig, MergeConfig, compress  # noqa: E402
from memforest_gpu.partition import partition  # noqa: E402
from memforest_gpu.synthetic import synthetic_store  # noqa: E402


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
    ap.add_argument("--out", default="runs/versus_reference.json")
    a = ap.parse_args(argv)
    print_hardware()
    records = []
    for n in [int(x) for x in a.sizes.split(",")]:
        store = synthetic_store(n, dim=a.dim, seed=n)
        cfg = CompressConfig(merge=MergeConfig(ratio=a.ratio))
        compress(synthetic_store(200, dim=a.dim, seed=1), cfg, merger=_NullMerger())  # warm-up
        with Timer() as ours:
            res = compress(store, cfg, merger=_NullMerger())
        # same partition and quotas for the reference
        names, codes = store.tenant_index()
        part = partition(store.embeddings, store.timestamps, codes, names, cfg.partition)
        tree_of = part.tree.cpu().numpy()
        idx_of = {i: j for j, i in enumerate(store.ids)}
        per_tree = defaultdict(int)
        ours_pairs = defaultdict(list)
        src_of = {i: frozenset([idx_of[i]]) for i in store.ids}
        for m in res.merges:
            a_s, b_s = src_of[m.a], src_of[m.b]
            t = int(tree_of[min(a_s | b_s)])
            per_tree[t] += 1
            ours_pairs[t].append(frozenset([a_s, b_s]))
            src_of[m.into] = a_s | b_s
        X = store.embeddings.cpu().numpy()
        with Timer() as ref_km:
            numpy_kmeans(X, n_clusters(n, cfg.partition.alpha), iters=cfg.partition.max_iter)
        with Timer() as ref_merge:
            ref = reference_pipeline(X, tree_of, dict(per_tree), eta=cfg.tree.eta)
        same = sum(ours_pairs[t] == [frozenset(p) for p in ref[t]] for t in per_tree)
        ref_total = ref_km.seconds + ref_merge.seconds
        rec = {"bench": "versus_reference", "n": n, "dim": a.dim, "ratio": a.ratio, "ours_s": ours.seconds,
               "ref_kmeans_s": ref_km.seconds, "ref_merge_s": ref_merge.seconds, "ref_total_s": ref_total,
               "speedup": ref_total / ours.seconds, "trees": len(per_tree), "trees_same_merges": same,
               "merges": len(res.merges)}
        print(f"n={n:>7} ours {ours.seconds:7.2f}s  reference {ref_total:8.2f}s "
              f"(kmeans {ref_km.seconds:.2f}s + merging {ref_merge.seconds:.2f}s)  speedup {rec['speedup']:6.1f}x  "
              f"identical merges in {same}/{len(per_tree)} trees", flush=True)
        records.append(rec)
    write_records(a.out, records)


if __name__ == "__main__":
    main()
