"""The bootstrap intervals of the evaluation's comparisons (docs/evaluation.md, "Noise").

:func:`cluster_bootstrap` resamples conversations (tenants), then questions inside each drawn
conversation, and each method's seeds, so neither the clustering of questions nor the seed
spread is ignored; :func:`paired_bootstrap` (questions only) is kept for reference.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["paired_bootstrap", "cluster_bootstrap", "cluster_weights"]


def paired_bootstrap(a: np.ndarray, b: np.ndarray, *, n: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Mean of ``a - b`` over items where both are defined, and its 95% percentile
    bootstrap interval. Shape: a, b (Q,) -> (mean, lo, hi)"""
    d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    d = d[~np.isnan(d)]
    if len(d) == 0:
        return math.nan, math.nan, math.nan
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(d), size=(n, len(d)))
    means = d[idx].mean(1)
    return float(d.mean()), float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))


def cluster_weights(clusters: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """How often each question is drawn in each of ``n`` two-stage resamples: clusters with
    replacement, then, inside each drawn cluster, its questions with replacement.
    Shape: clusters (Q,) int codes -> (n, Q) float64 counts"""
    Q = len(clusters)
    members = [np.flatnonzero(clusters == c) for c in np.unique(clusters)]
    C = len(members)
    W = np.zeros((n, Q), dtype=np.float64)
    picks = rng.integers(0, C, size=(n, C))  # (n, C) clusters drawn per resample
    for r in range(n):
        for c in picks[r]:
            m = members[c]
            W[r] += np.bincount(m[rng.integers(0, len(m), size=len(m))], minlength=Q)
    return W


def cluster_bootstrap(a: np.ndarray, b: np.ndarray, clusters, *, n: int = 2000, seed: int = 0,
                      weights: np.ndarray | None = None) -> tuple[float, float, float]:
    """Mean of ``a - b`` (seeds averaged) over the questions where both are defined, and its
    95% percentile interval from a two-stage cluster bootstrap with seed variation: each
    resample draws clusters (conversations) with replacement, questions inside each drawn
    cluster with replacement, and, for each method, as many seeds (rows) as it has, with
    replacement, whose mean it takes (so the seed spread of the seed-averaged score counts).

    Shape: a (S_a, Q), b (S_b, Q) per-seed scores (a (Q,) is one seed), clusters (Q,) ->
    (mean, lo, hi). ``weights``: precomputed :func:`cluster_weights` (n, Q) to share
    between comparisons (then ``n`` is its row count).
    """
    a = np.atleast_2d(np.asarray(a, np.float64))
    b = np.atleast_2d(np.asarray(b, np.float64))
    if a.shape[1] != b.shape[1] or len(clusters) != a.shape[1]:
        raise ValueError(f"a, b and clusters must have one value per question, got shapes {a.shape}, {b.shape} "
                         f"and {np.shape(clusters)}")
    valid = ~(np.isnan(a).any(0) | np.isnan(b).any(0))  # (Q,)
    if not valid.any():
        return math.nan, math.nan, math.nan
    point = float((a[:, valid].mean(0) - b[:, valid].mean(0)).mean())
    rng = np.random.default_rng(seed)
    if weights is None:
        _, codes = np.unique(np.asarray(clusters), return_inverse=True)
        weights = cluster_weights(codes, n, rng)
    n = weights.shape[0]
    v = valid.astype(np.float64)
    cnt = weights @ v  # (n,)
    rows = np.arange(n)[:, None]
    sums_a = weights @ np.where(valid, a, 0.0).T  # (n, S_a)
    sums_b = weights @ np.where(valid, b, 0.0).T  # (n, S_b)
    sa = sums_a[rows, rng.integers(0, a.shape[0], (n, a.shape[0]))].mean(1)  # seeds resampled too: (n,)
    sb = sums_b[rows, rng.integers(0, b.shape[0], (n, b.shape[0]))].mean(1)
    ok = cnt > 0
    stats = (sa[ok] - sb[ok]) / cnt[ok]
    return point, float(np.quantile(stats, 0.025)), float(np.quantile(stats, 0.975))
