"""How many nodes each tree of a compacted tenant loses, and so which trees are re-planned.

A tenant over its budget keeps ``G`` nodes and loses ``R = n - G``. The offline one-shot
compress would leave each tree a **fair share** of ``G`` proportional to the originals it
holds; a tree's **excess** is ``size - originals * G / O`` (``O``: the tenant's originals).

Re-planned are the trees that received memories (they hold uncompressed originals) and
every tree more than ``slack`` of its size above its fair share. When their positive excess
plus ``slack`` times their size does not cover ``R`` (or their room, ``size - 1`` each, does
not: a tree keeps a node), more trees are added, largest excess first (ties: lower tree id).
``R`` is split over the chosen trees in proportion to their positive excess by largest
remainder (:func:`~memforest_gpu.engine.quotas.allocate_segments`; equally when none has
any), none above its room; what no tree can take is the tenant's shortfall. A tree that
gets nothing is not re-planned.

So a few new memories re-plan the trees they reached (which may end a little below their
share, at most ``slack``), while an older tree is re-planned only once the tenant's growth
has put it ``slack`` above its share: each tree about once per ``slack`` of growth, which
keeps the work of a compaction proportional to what arrived. All tenants at once.
"""
from __future__ import annotations

import numpy as np

from .quotas import allocate_segments

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
    first = touched | (excess > slack * size)  # must be re-planned: received memories, or over the slack
    order = np.lexsort((np.arange(len(tt)), -excess, ~first, tt))  # by tenant, the first ones, excess desc, id
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
