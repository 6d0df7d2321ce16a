"""How many nodes each tree of a compacted tenant loses, and so which trees are re-planned.

A tenant over its node limit keeps ``G`` nodes and loses ``R = n - G``. The offline one-shot
compress would leave each tree a **fair share** of ``G`` proportional to the originals it
holds; a tree's **excess** is ``size - originals * G / O`` (``O``: the tenant's originals).

Re-planned are, first, every tree more than ``slack`` of its size above its fair share (it
must shrink), then more trees, largest excess first (the trees that received memories hold
uncompressed originals and come first; ties: those that received memories, then the lower
tree id), until the chosen trees' positive excess plus ``slack`` times their size covers
``R``, and their room (``size - 1`` each: a tree keeps a node) does too. ``R`` is split over
the chosen trees in proportion to their positive excess by largest remainder
(:func:`~memforest_gpu.engine.quotas.allocate_segments`; equally when none has any), none
above its room; what no tree can take is the tenant's shortfall. A tree that gets nothing
is not re-planned.

So a few new memories re-plan a few of the trees they reached (each may end up to ``slack``
below its share, or keep some new memories up to ``slack`` above it), and any tree is
re-planned once it drifts ``slack`` above its share: the work of a compaction follows
what arrived, not the tenant's size. All tenants at once.
"""
from __future__ import annotations

import numpy as np

from ..quotas import allocate_segments

__all__ = ["compaction_quotas", "EXCESS_SCALE"]

EXCESS_SCALE = 1000  # excess weights are integers: excess * EXCESS_SCALE, rounded down


def _exclusive_cumsum(x: np.ndarray, seg: np.ndarray) -> np.ndarray:
    """Sum of the items before each one in its (contiguous) segment. Shape: (T,), (T,) -> (T,)"""
    c = np.cumsum(x) - x
    if len(x) == 0:
        return c
    starts = np.r_[0, np.flatnonzero(np.diff(seg)) + 1]
    base = np.repeat(c[starts], np.diff(np.r_[starts, len(x)]))
    return c - base


def compaction_quotas(size: np.ndarray, originals: np.ndarray, tree_tenant: np.ndarray, keep: np.ndarray,
                      touched: np.ndarray | None = None, slack: float = 0.05
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Removals per tree for tenants that keep ``keep`` nodes (see the module docstring).

    Shape: size, originals, tree_tenant, touched (T,) with tree_tenant sorted; keep (n_tenants,)
           -> per_tree (T,), remove (n_tenants,) = n - keep (at least 0), shortfall (n_tenants,)
    """
    size = np.asarray(size, dtype=np.int64)
    originals = np.asarray(originals, dtype=np.int64)
    tt = np.asarray(tree_tenant, dtype=np.int64)
    touched = np.zeros(len(tt), dtype=bool) if touched is None else np.asarray(touched, dtype=bool)
    n_ten = len(keep)
    n = np.bincount(tt, weights=size, minlength=n_ten).astype(np.int64)
    o = np.bincount(tt, weights=originals, minlength=n_ten).astype(np.float64)
    remove = np.maximum(n - np.asarray(keep, dtype=np.int64), 0)
    excess = size - originals * (np.asarray(keep, dtype=np.float64)[tt] / np.maximum(o[tt], 1.0))  # (T,)
    first = excess > slack * size  # must shrink: more than the slack above its share
    order = np.lexsort((np.arange(len(tt)), ~touched, -excess, ~first, tt))  # tenant, first, excess desc, touched, id
    st = tt[order]
    pos_e = np.maximum(excess[order], 0.0)
    room = size[order] - 1
    cover = _exclusive_cumsum(pos_e + slack * size[order], st)
    need = remove[st]
    chosen = first[order] | (cover < need) | (_exclusive_cumsum(room, st) < need)
    chosen &= need > 0
    weights = np.zeros(len(tt), dtype=np.int64)
    caps = np.zeros(len(tt), dtype=np.int64)
    weights[order[chosen]] = np.floor(pos_e[chosen] * EXCESS_SCALE).astype(np.int64)
    caps[order[chosen]] = room[chosen]
    per_tree = allocate_segments(remove, weights, caps, tt, n_ten)
    given = np.bincount(tt, weights=per_tree, minlength=n_ten).astype(np.int64)
    return per_tree, remove, remove - given
