"""The straightforward MemForest pipeline, written the way the paper's authors' code works:
numpy k-means (k-means++ seeding), a Python loop over trees, and inside each tree a Python Kruskal over all
pairs rebuilt after every single merge. Used by ``versus_reference.py`` as the baseline
for speed, and to check that our batched engine makes exactly the same merges.

Conventions match the engine so results can be compared merge for merge: slots of a
tree are in time order, the merged node takes the lower slot, edge ties go to the
smaller (min, max) slot pair, merged embedding = normalised mean of the two inputs.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["numpy_kmeans", "kruskal_max", "reference_merges", "reference_pipeline"]


def numpy_kmeans(X: np.ndarray, k: int, *, iters: int = 30, seed: int = 0) -> np.ndarray:
    """Plain k-means as SPEC asks for it: k-means++ seeding (each step re-measures every
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


def kruskal_max(W: np.ndarray, alive: list[int]) -> list[tuple[int, int, float]]:
    """Maximum spanning tree over the alive slots: all pairs sorted, union-find."""
    edges = [(-float(W[i, j]), i, j) for a, i in enumerate(alive) for j in alive[a + 1:]]
    edges.sort()
    parent = {i: i for i in alive}

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    tree = []
    for nw, i, j in edges:
        ri, rj = find(i), find(j)
        if ri != rj:
            parent[ri] = rj
            tree.append((i, j, -nw))
            if len(tree) == len(alive) - 1:
                break
    return tree


def reference_merges(X: np.ndarray, merges: int, *, eta: float = 0.99) -> list[tuple[frozenset, frozenset]]:
    """Merge ``merges`` times inside one tree; returns, in order, the two merged nodes of
    each merge as sets of original slot indices.

    Shape: X (n, D) rows in slot (time) order.
    """
    X = X.astype(np.float32).copy()
    alive = list(range(len(X)))
    src = {i: frozenset([i]) for i in alive}
    out = []
    for _ in range(merges):
        W = X @ X.T  # rebuilt after every merge, as the straightforward code does
        tree = kruskal_max(W, alive)
        deg = {i: 0 for i in alive}
        for i, j, _ in tree:
            deg[i] += 1
            deg[j] += 1
        best = max(tree, key=lambda e: (eta * e[2] - (1 - eta) * (deg[e[0]] + deg[e[1]]), -e[0] * len(X) - e[1]))
        i, j = best[0], best[1]
        keep, drop = min(i, j), max(i, j)
        v = X[keep] + X[drop]
        X[keep] = v / np.linalg.norm(v)
        X[drop] = 0
        alive.remove(drop)
        out.append((src[keep], src[drop]))
        src[keep] = src[keep] | src.pop(drop)
    return out


def reference_pipeline(X: np.ndarray, tree_of: np.ndarray, quota: dict[int, int], *, eta: float = 0.99):
    """A Python loop over trees; each tree merged by :func:`reference_merges`.

    Shape: X (N, D) in time order, tree_of (N,) -> {tree: [(nodes_a, nodes_b), ...]} as sets of node ids
    """
    out = {}
    for t in sorted(quota):
        nodes = np.flatnonzero(tree_of == t)
        pairs = reference_merges(X[nodes], quota[t], eta=eta)
        out[t] = [(frozenset(int(nodes[i]) for i in a), frozenset(int(nodes[i]) for i in b)) for a, b in pairs]
    return out


def n_clusters(n: int, alpha: float) -> int:
    return max(1, min(n, int(math.floor(alpha * n))))
