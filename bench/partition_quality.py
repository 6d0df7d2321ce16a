"""What two-level k-means costs in quality: exact against two-level partitioning of one
tenant, time and k-means objective (sum of squared distances of points to their
cluster's mean, over the k-means labels before the temporal reassignment).

    python bench/partition_quality.py --sizes 30000,100000 --out runs/partition_quality.json
    python bench/partition_quality.py --sizes 10000,30000 --seedings "batched,k-means||" --seeds 0,1,2

With several ``--seedings`` or ``--seeds``, each (k-means, seeding) line is the mean over the seeds,
and each seeding after the first is compared with the first (objective and time).
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import Timer, peak_rss_mb, print_hardware, write_records  # noqa: E402

from memforest_gpu import PartitionConfig  # noqa: E402
from memforest_gpu.engine.partition import partition_nodes  # noqa: E402
from memforest_gpu.store.synthetic import synthetic_store  # noqa: E402


def kmeans_objective(X: torch.Tensor, labels: torch.Tensor) -> float:
    """Sum over points of |x - mean(cluster)|^2, in float64. Shape: X (n, D), labels (n,)"""
    Xd = X.double()
    k = int(labels.max()) + 1
    sums = torch.zeros(k, X.shape[1], dtype=torch.float64, device=X.device).index_add_(0, labels, Xd)
    counts = torch.bincount(labels, minlength=k).clamp(min=1).double()
    means = sums / counts[:, None]
    return float(((Xd - means[labels]) ** 2).sum())


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="30000,100000")
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--methods", default="exact,two-level")
    ap.add_argument("--seedings", default="batched", help="k-means seedings, comma-separated (PartitionConfig.seeding)")
    ap.add_argument("--seeds", default="0", help="partition seeds, comma-separated")
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default="runs/partition_quality.json")
    a = ap.parse_args(argv)
    print_hardware()
    records = []
    for n in [int(x) for x in a.sizes.split(",")]:
        store = synthetic_store(n, dim=a.dim, seed=n, device=a.device)
        names, codes = store.tenant_index()
        exact = None
        for method in a.methods.split(","):
            first = None
            for seeding in a.seedings.split(","):
                runs = [_run(store, names, codes, a.alpha, method, seeding, int(s)) for s in a.seeds.split(",")]
                sec, obj = sum(r[0] for r in runs) / len(runs), sum(r[1] for r in runs) / len(runs)
                part = runs[-1][2]
                exact = obj if method == "exact" and exact is None else exact
                first = (sec, obj) if first is None else first
                rec = {"bench": "partition_quality", "n": n, "dim": a.dim, "alpha": a.alpha, "kmeans": method,
                       "seeding": seeding, "seeds": a.seeds, "seconds": sec, "objective": obj,
                       "objectives": [r[1] for r in runs], "clusters": int(part.kmeans_tree.max()) + 1,
                       "trees": int(part.tree_tenant.shape[0]), "peak_mb": peak_rss_mb(),
                       "objective_vs_exact": (obj / exact - 1.0) if exact else None,
                       "objective_vs_first_seeding": obj / first[1] - 1.0, "seconds_vs_first_seeding": sec / first[0]}
                vs = rec["objective_vs_exact"]
                extra = f"  objective {100 * vs:+.1f}% vs exact" if exact and method != "exact" else ""
                if seeding != a.seedings.split(",")[0]:
                    extra += f"  {100 * rec['objective_vs_first_seeding']:+.1f}% objective, " \
                             f"{rec['seconds_vs_first_seeding']:.2f}x time vs {a.seedings.split(',')[0]}"
                print(f"n={n:>8} {method:>9} {seeding:>9}: {sec:8.2f}s  objective {obj:.1f}  "
                      f"clusters {rec['clusters']}{extra}", flush=True)
                records.append(rec)
    write_records(a.out, records)


def _run(store, names, codes, alpha: float, method: str, seeding: str, seed: int):
    """(seconds, k-means objective, partition) of one partition of ``store``."""
    cfg = PartitionConfig(alpha=alpha, kmeans=method, two_level_min_nodes=1, seeding=seeding, seed=seed)
    with Timer() as t:
        part = partition_nodes(store.embeddings, store.timestamps, codes.to(store.embeddings.device), names, cfg)
    return t.seconds, kmeans_objective(store.embeddings, part.kmeans_tree), part


if __name__ == "__main__":
    main()
