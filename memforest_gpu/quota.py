"""How many nodes each tree must lose: exact per-tenant totals, split by size."""
from __future__ import annotations

import math

import numpy as np

__all__ = ["removal_target", "allocate"]


def removal_target(n: int, ratio: float) -> int:
    """round(ratio * n), halves rounded up: the exact number of nodes a tenant loses."""
    return int(math.floor(ratio * n + 0.5))


def allocate(total: int, weights: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """Split ``total`` into integers proportional to ``weights`` (largest remainder,
    ties to the lower index), none above its cap. Returns at most ``caps.sum()`` in all.

    Shape: weights (T,), caps (T,) -> (T,) int64
    """
    w = np.asarray(weights, dtype=np.float64)
    caps = np.asarray(caps, dtype=np.int64)
    out = np.zeros(len(w), dtype=np.int64)
    remaining = min(int(total), int(caps.sum()))
    while remaining > 0:
        room = caps - out
        free = room > 0
        ww = np.where(free, w, 0.0)
        if ww.sum() <= 0:
            ww = free.astype(np.float64)
        share = remaining * ww / ww.sum()
        base = np.minimum(np.floor(share).astype(np.int64), room)
        out += base
        left = remaining - int(base.sum())
        room = caps - out
        frac = np.where(room > 0, share - np.floor(share), -1.0)
        cand = np.flatnonzero(room > 0)
        order = cand[np.argsort(-frac[cand], kind="stable")]
        give = order[:left]
        out[give] += 1
        remaining -= int(base.sum()) + len(give)
    return out
