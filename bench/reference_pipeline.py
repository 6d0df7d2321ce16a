"""The straightforward k-means of the MemForest pipeline, written the way the paper's
authors' code works: numpy, k-means++ seeding, full (N, K) distances each Lloyd step.
``versus_reference.py`` times it as the reference's partition stage; the reference's
merging is :mod:`memforest_gpu.engine.reference` (the one plain-Python reference of the merge order,
checked merge for merge against the engine by ``tests/test_merge_order.py``).
"""
from __future__ import annotations

import argparse
import math

import numpy as np

__all__ = ["numpy_kmeans", "n_clusters"]


def numpy_kmeans(X: np.ndarray, k: int, *, iters: int = 30, seed: int = 0) -> np.ndarray:
    """Plain k-means as docs/method.md asks for it: k-means++ seeding (each step re-measures every
    point against the new centre), then Lloyd steps with the full (N, K) distance matrix
    until no label changes."""
    rng = np.random.default_rng(seed)
    n = len(X)
    sq = (X * X).sum(1)
    C = np.empty((k, X.shape[1]), dtype=X.dtype)
    C[0] = X[rng.integers(n)]
    d2 = np.maximum(sq - 2 * X @ C[0] + (C[0] * C[0]).sum(), 0)
    for j in range(1, k):
        w = d2.astype(np.float64)
        p = w / w.sum() if w.sum() > 0 else np.full(n, 1.0 / n)
        C[j] = X[rng.choice(n, p=p)]
        d2 = np.minimum(d2, np.maximum(sq - 2 * X @ C[j] + (C[j] * C[j]).sum(), 0))
    labels = np.full(n, -1)
    for _ in range(iters):
        d = sq[:, None] - 2 * X @ C.T + (C * C).sum(1)[None, :]
        new = d.argmin(1)
        if (new == labels).all():
            break
        labels = new
        for j in range(k):
            members = X[labels == j]
            if len(members):
                C[j] = members.mean(0)
    return labels


def n_clusters(n: int, alpha: float) -> int:
    return max(1, min(n, int(math.floor(alpha * n))))


if __name__ == "__main__":  # a module the benchmarks import: run alone, it only explains itself
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog="Imported by other bench/ scripts (bench/README.md); it runs nothing "
                                   "by itself.").parse_args()
