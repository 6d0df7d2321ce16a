"""How many nodes each tree must lose: exact per-tenant totals, split by size
(docs/method.md section 3).

Every tenant loses exactly ``round(ratio * n_t)`` nodes (halves up), spread over its trees
in proportion to their size by largest remainder (ties to the lower tree), none above
``size - 1``; what the trees cannot take is the tenant's shortfall. All tenants are
allocated at once with integer arithmetic (no per-tenant Python loop, no float rounding
in the remainders), and a tree that stops early hands its leftover to its tenant's other
trees with the same rule (:func:`redistribute`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["Quotas", "removal_quotas", "removal_target", "allocate", "allocate_segments", "redistribute"]


@dataclass(frozen=True)
class Quotas:
    """Removals per tree and per tenant. Trees are ordered tenant-major (as in
    :class:`~memforest_gpu.engine.partition.Partition`).

    Shape: per_tree, tree_size, tree_tenant (T,); target, shortfall (n_tenants,), int64
    """

    per_tree: np.ndarray  # nodes each tree must lose
    tree_size: np.ndarray  # nodes per tree
    tree_tenant: np.ndarray  # tenant code per tree
    target: np.ndarray  # round(ratio * n_t) per tenant
    shortfall: np.ndarray  # target - what the trees can take (before any merging)

    @property
    def total(self) -> int:
        return int(self.per_tree.sum())


def removal_target(n: int, ratio: float) -> int:
    """round(ratio * n), halves rounded up: the exact number of nodes a tenant loses."""
    return int(math.floor(ratio * n + 0.5))


def removal_quotas(tree_size: np.ndarray, tree_tenant: np.ndarray, tenant_size: np.ndarray, ratio: float) -> Quotas:
    """Each tenant's exact removal target split over its trees.

    Shape: tree_size, tree_tenant (T,) with tree_tenant sorted; tenant_size (n_tenants,) -> Quotas
    """
    tree_size = np.asarray(tree_size, dtype=np.int64)
    tree_tenant = np.asarray(tree_tenant, dtype=np.int64)
    tenant_size = np.asarray(tenant_size, dtype=np.int64)
    target = np.floor(ratio * tenant_size.astype(np.float64) + 0.5).astype(np.int64)
    per_tree = allocate_segments(target, tree_size, tree_size - 1, tree_tenant, len(tenant_size))
    given = np.bincount(tree_tenant, weights=per_tree, minlength=len(tenant_size)).astype(np.int64)
    return Quotas(per_tree, tree_size, tree_tenant, target, target - given)


def allocate(total: int, weights: np.ndarray, caps: np.ndarray) -> np.ndarray:
    """Split ``total`` into integers proportional to ``weights`` (largest remainder,
    ties to the lower index), none above its cap. Returns at most ``caps.sum()`` in all.

    Shape: weights (T,) int, caps (T,) -> (T,) int64
    """
    w = np.asarray(weights, dtype=np.int64)
    return allocate_segments(np.array([int(total)], dtype=np.int64), w, caps, np.zeros(len(w), dtype=np.int64), 1)


def allocate_segments(total: np.ndarray, weights: np.ndarray, caps: np.ndarray, seg: np.ndarray,
                      n_seg: int) -> np.ndarray:
    """:func:`allocate` for many independent segments at once: segment ``s`` splits
    ``total[s]`` over its items (``seg == s``, contiguous: ``seg`` sorted).

    Each pass gives every item ``floor(remaining * w / W)`` (at most its room), then one
    more to the items with the largest remainders (ties: lower index) until the segment's
    total is given; items that hit their cap drop out and the rest is shared again.

    Shape: total (S,), weights (T,) int, caps (T,), seg (T,) sorted in [0, S) -> (T,) int64
    """
    w = np.asarray(weights, dtype=np.int64)
    caps = np.asarray(caps, dtype=np.int64)
    seg = np.asarray(seg, dtype=np.int64)
    T = len(w)
    out = np.zeros(T, dtype=np.int64)
    if T == 0:
        return out
    if (w < 0).any() or (np.diff(seg) < 0).any():
        raise ValueError("weights must be >= 0 and seg sorted")
    remaining = np.minimum(np.asarray(total, dtype=np.int64),
                           np.bincount(seg, weights=np.maximum(caps, 0), minlength=n_seg).astype(np.int64))
    idx = np.arange(T)
    while (remaining > 0).any():
        room = caps - out
        free = room > 0
        ww = np.where(free, w, 0)
        wsum = np.bincount(seg, weights=ww, minlength=n_seg).astype(np.int64)
        flat = wsum <= 0  # no weight left among the free items: share equally
        ww = np.where(flat[seg], free.astype(np.int64), ww)
        wsum = np.bincount(seg, weights=ww, minlength=n_seg).astype(np.int64)
        act = remaining[seg] > 0
        num = remaining[seg] * ww
        den = np.maximum(wsum[seg], 1)
        base = np.where(act, np.minimum(num // den, room), 0)
        out += base
        base_sum = np.bincount(seg, weights=base, minlength=n_seg).astype(np.int64)
        left = remaining - base_sum
        cand = act & (caps - out > 0)
        c = idx[cand]
        rem = (num % den)[cand]
        order = c[np.lexsort((c, -rem, seg[c]))]  # by segment, remainder desc, index
        rank = np.arange(len(order)) - np.searchsorted(seg[order], seg[order])
        give = order[rank < left[seg[order]]]
        out[give] += 1
        remaining = left - np.bincount(seg[give], minlength=n_seg)
    return out


def redistribute(stuck: np.ndarray, quota: np.ndarray, count: np.ndarray, tree_tenant: np.ndarray,
                 shortfall: np.ndarray) -> None:
    """Move the unmet quota of stuck trees to trees of the same tenant that can still merge
    (in place; largest remainder by live node count, room ``count - 1 - quota``); what no
    tree can take is added to the tenant's shortfall.

    Shape: stuck (T,) bool, quota, count, tree_tenant (T,), shortfall (n_tenants,)
    """
    left = stuck & (quota > 0)
    if not left.any():
        return
    n_ten = len(shortfall)
    give = np.bincount(tree_tenant[left], weights=quota[left], minlength=n_ten).astype(np.int64)
    quota[left] = 0
    recv = np.flatnonzero(~stuck & (give[tree_tenant] > 0))
    room = np.maximum(count[recv] - 1 - quota[recv], 0)
    add = allocate_segments(give, count[recv], room, tree_tenant[recv], n_ten)
    quota[recv] += add
    shortfall += give - np.bincount(tree_tenant[recv], weights=add, minlength=n_ten).astype(np.int64)
