"""Retrieval latency and throughput: plain top-k vs AGPR, against store size, and the
search speedup after 30/50/70% compression (same index type, same queries, one run).

    python bench/retrieval.py --sizes 10000,100000 --queries 1000 --out runs/retrieval.json
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import Timer, print_hardware, write_records  # noqa: E402

from memforest_gpu import CompressConfig, MergeConfig, RetrievalConfig, Retriever, compress  # noqa: E402
from memforest_gpu.synthetic import synthetic_store  # noqa: E402


def _time_search(r: Retriever, q, cfg, reps: int = 3) -> float:
    r.search(q[:8], config=cfg)  # warm-up
    best = float("inf")
    for _ in range(reps):
        with Timer() as t:
            r.search(q, config=cfg)
        best = min(best, t.seconds)
    return best


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("-k", type=int, default=10)
    ap.add_argument("--ratios", default="0.3,0.5,0.7")
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default="runs/retrieval.json")
    a = ap.parse_args(argv)
    print_hardware()
    records = []
    for n in [int(x) for x in a.sizes.split(",")]:
        store = synthetic_store(n, dim=a.dim, seed=n, device=a.device)
        g = torch.Generator().manual_seed(0)
        q = store.embeddings[torch.randint(0, n, (a.queries,), generator=g).to(store.device)]
        q = torch.nn.functional.normalize(q + 0.3 * torch.randn(q.shape, generator=g).to(q.device), dim=1)
        base = {}
        for agpr in (False, True):
            cfg = RetrievalConfig(k=a.k, agpr=agpr)
            s = _time_search(Retriever(store), q, cfg)
            base[agpr] = s
            rec = {"bench": "retrieval", "n": n, "dim": a.dim, "queries": a.queries, "k": a.k, "agpr": agpr,
                   "ratio": 0.0, "seconds": s, "qps": a.queries / s, "speedup": 1.0}
            print(f"n={n:>8} ratio 0.0 {'agpr' if agpr else 'topk':>4}: {s * 1e3:8.1f} ms for {a.queries} queries "
                  f"({rec['qps']:9.0f} q/s)", flush=True)
            records.append(rec)
        for ratio in [float(x) for x in a.ratios.split(",")]:
            small = compress(store, CompressConfig(merge=MergeConfig(ratio=ratio, schedule="matching")),
                             device=a.device).store
            for agpr in (False, True):
                cfg = RetrievalConfig(k=a.k, agpr=agpr)
                s = _time_search(Retriever(small), q, cfg)
                rec = {"bench": "retrieval", "n": n, "dim": a.dim, "queries": a.queries, "k": a.k, "agpr": agpr,
                       "ratio": ratio, "nodes": len(small), "seconds": s, "qps": a.queries / s,
                       "speedup": base[agpr] / s}
                print(f"n={n:>8} ratio {ratio:.1f} {'agpr' if agpr else 'topk':>4}: {s * 1e3:8.1f} ms "
                      f"({rec['qps']:9.0f} q/s)  search speedup {rec['speedup']:.2f}x", flush=True)
                records.append(rec)
    write_records(a.out, records)


if __name__ == "__main__":
    main()
