"""What an alpha gives at a store size: trees per tenant, the largest tree, and the memory of
the tree stage's dense per-tree cosine matrices (trees padded to powers of two, float32, as
``memforest_gpu.engine.trees`` lays them out). Runs only the partition stage.

    python docs/studies/scripts/partition_alpha.py --n 1000000 --alphas 0.001,0.05 --kmeans two-level

Same store as ``bench/scaling.py`` (8 tenants, one holding half the nodes, d = 384, seed = n).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "bench"))  # bench/common.py
sys.path.insert(0, HERE)  # the other study scripts
from common import Timer, peak_rss_mb, print_hardware, write_records  # noqa: E402

from memforest_gpu.config import PartitionConfig  # noqa: E402
from memforest_gpu.engine.partition import n_clusters, partition_nodes  # noqa: E402
from memforest_gpu.store.synthetic import synthetic_store  # noqa: E402


def tree_stats(tree: np.ndarray, tree_tenant: np.ndarray, names: list[str]) -> dict:
    """Per tenant: trees, nodes, largest tree; overall: the padded (B, m, m) float32 bytes."""
    size = np.bincount(tree, minlength=len(tree_tenant))
    pad = 2 ** np.ceil(np.log2(np.maximum(size, 1))).astype(np.int64)
    per = {}
    for t, name in enumerate(names):
        s = size[tree_tenant == t]
        per[name] = {"nodes": int(s.sum()), "trees": int((s > 0).sum()), "largest": int(s.max()),
                     "median": float(np.median(s[s > 0]))}
    return {"per_tenant": per, "largest": int(size.max()), "trees": int((size > 0).sum()),
            "w_bytes": int((pad[size >= 2] ** 2).sum() * 4)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--tenants", type=int, default=8)
    ap.add_argument("--big-share", type=float, default=0.5)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--alphas", default="0.001,0.05")
    ap.add_argument("--kmeans", default="two-level")
    ap.add_argument("--out", default="runs/partition_alpha.json")
    a = ap.parse_args(argv)
    print_hardware()
    store = synthetic_store(a.n, tenants=a.tenants, dim=a.dim, big_tenant_share=a.big_share, seed=a.n)
    names, codes = store.tenant_index()
    records = []
    for alpha in [float(x) for x in a.alphas.split(",")]:
        cfg = PartitionConfig(alpha=alpha, kmeans=a.kmeans, two_level_min_nodes=20000)
        with Timer() as t:
            part = partition_nodes(store.embeddings, store.timestamps, codes, names, cfg)
        st = tree_stats(part.tree.numpy(), part.tree_tenant.numpy(), names)
        big = max(st["per_tenant"].values(), key=lambda v: v["nodes"])
        rec = {"bench": "partition_alpha", "n": a.n, "alpha": alpha, "kmeans": a.kmeans, "seconds": t.seconds,
               "peak_mb": peak_rss_mb(), **st,
               "k_formula": {n: n_clusters(v["nodes"], alpha) for n, v in st["per_tenant"].items()}}
        print(f"n={a.n} alpha={alpha:g} {a.kmeans}: {st['trees']} trees, largest {st['largest']}; big tenant "
              f"{big['nodes']} nodes -> {big['trees']} trees (median {big['median']:.0f}, largest {big['largest']}); "
              f"tree-stage cosines {st['w_bytes'] / 2**30:.2f} GiB; partition {t.seconds:.1f}s, "
              f"peak {rec['peak_mb']:.0f} MB", flush=True)
        records.append(rec)
    write_records(a.out, records)


if __name__ == "__main__":
    main()
