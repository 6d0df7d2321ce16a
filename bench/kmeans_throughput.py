"""Throughput of the k-means assignment step (the hot loop): achieved TFLOP/s of the
fused best-match (Triton on CUDA) and of the PyTorch path, at one (n, K, D).

    python bench/kmeans_throughput.py --n 1000000 --k 50000 --dim 384
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import Timer, print_hardware, write_records  # noqa: E402

from memforest_gpu.kernels.assign import best_match  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100000)
    ap.add_argument("--k", type=int, default=None, help="default: n / 20")
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", default="runs/kmeans_throughput.json")
    a = ap.parse_args(argv)
    print_hardware()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    k = a.k or max(1, a.n // 20)
    g = torch.Generator(device="cpu").manual_seed(0)
    X = torch.nn.functional.normalize(torch.randn(1, a.n, a.dim, generator=g), dim=-1).to(dev)
    C = X[:, torch.randperm(a.n, generator=g)[:k].to(dev)]
    cv = torch.ones(1, k, dtype=torch.bool, device=dev)
    flops = 2.0 * a.n * k * a.dim
    records = []
    backends = ["torch"] + (["triton"] if dev.type == "cuda" else [])
    for backend in backends:
        best_match(X[:, :1024], C, cv, backend=backend)  # warm-up / compile
        best = float("inf")
        for _ in range(a.reps):
            with Timer() as t:
                best_match(X, C, cv, backend=backend)
            best = min(best, t.seconds)
        rec = {"bench": "kmeans_assign", "n": a.n, "k": k, "dim": a.dim, "backend": backend, "seconds": best,
               "tflops": flops / best / 1e12}
        print(f"assign n={a.n} k={k} d={a.dim} {backend:>6}: {best:.3f}s  {rec['tflops']:.2f} TFLOP/s", flush=True)
        records.append(rec)
    write_records(a.out, records)


if __name__ == "__main__":
    main()
