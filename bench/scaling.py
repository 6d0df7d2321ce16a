"""Time per stage against store size, on synthetic memory-like stores.

Stores have clustered embeddings with temporal drift, several small tenants and one big
tenant (``--big-share`` of the nodes). Merging uses the extractive (non-LLM) merger and
mean embeddings (re-embedding excluded) unless ``--reembed`` is given.

    python bench/scaling.py --sizes 1000,10000,100000 --out runs/scaling.json --plot runs/scaling.png
    python bench/scaling.py --sizes 1000000 --kmeans two-level --schedule matching
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import Timer, peak_rss_mb, print_hardware, reset_peak, write_records  # noqa: E402

from memforest_gpu import CompressConfig, MergeConfig, PartitionConfig, compress  # noqa: E402
from memforest_gpu.synthetic import synthetic_store  # noqa: E402

STAGES = ("partition", "setup", "trees", "merge", "embed", "output")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,3000,10000,30000,100000")
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--tenants", type=int, default=8)
    ap.add_argument("--big-share", type=float, default=0.5, help="fraction of nodes in the one big tenant")
    ap.add_argument("--ratio", type=float, default=0.5)
    ap.add_argument("--schedule", default="sequential")
    ap.add_argument("--kmeans", default="exact", help="exact | two-level")
    ap.add_argument("--device", default=None)
    ap.add_argument("--reembed", action="store_true", help="re-embed merged text with all-MiniLM-L6-v2")
    ap.add_argument("--out", default="runs/scaling.json")
    ap.add_argument("--plot", default=None)
    a = ap.parse_args(argv)
    print_hardware()
    embedder = None
    if a.reembed:
        from memforest_gpu import SentenceTransformerEmbedder

        embedder = SentenceTransformerEmbedder(device=a.device)
    records = []
    cfg = CompressConfig(partition=PartitionConfig(kmeans=a.kmeans, two_level_min_nodes=20000),
                         merge=MergeConfig(ratio=a.ratio, schedule=a.schedule))
    compress(synthetic_store(500, tenants=2, dim=a.dim if not a.reembed else 384), cfg, device=a.device)  # warm-up
    for n in [int(x) for x in a.sizes.split(",")]:
        store = synthetic_store(n, tenants=min(a.tenants, n), dim=a.dim if not a.reembed else 384,
                                big_tenant_share=a.big_share, seed=n, device=a.device)
        store_mb = peak_rss_mb()
        reset_peak()  # peak of the compression itself, not of building the synthetic store
        with Timer() as t:
            res = compress(store, cfg, embedder=embedder, device=a.device)
        sec = res.report.seconds
        rec = {"bench": "scaling", "n": n, "dim": store.dim, "tenants": len(store.tenant_names()),
               "kmeans": a.kmeans, "schedule": a.schedule, "ratio": a.ratio, "reembed": a.reembed,
               "seconds": t.seconds, "peak_mb": peak_rss_mb(), "store_build_peak_mb": store_mb, "rounds": res.report.rounds,
               "trees": res.report.trees, "nodes_out": res.report.nodes_out,
               **{f"{s}_s": sec.get(s, 0.0) for s in STAGES}}
        print(f"n={n:>8} total {t.seconds:8.2f}s  " + "  ".join(f"{s} {sec.get(s, 0):.2f}" for s in STAGES)
              + f"  rounds {res.report.rounds}  peak {rec['peak_mb']:.0f} MB", flush=True)
        records.append(rec)
    write_records(a.out, records)
    if a.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        ns = [r["n"] for r in records]
        for s in ("partition", "trees", "merge", "embed"):
            ax.plot(ns, [max(r[f"{s}_s"], 1e-3) for r in records], marker="o", label=s)
        ax.plot(ns, [r["seconds"] for r in records], marker="s", color="black", label="total")
        ax.set_xscale("log"), ax.set_yscale("log"), ax.set_xlabel("nodes"), ax.set_ylabel("seconds")
        ax.set_title(f"memforest compress, {a.kmeans} k-means, {a.schedule}")
        ax.legend(), fig.tight_layout(), fig.savefig(a.plot, dpi=120)
        print(f"# wrote {a.plot}")


if __name__ == "__main__":
    main()
