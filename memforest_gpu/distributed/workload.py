"""Who does what: whole tenants, or whole trees of a split tenant, balanced by cost."""
from __future__ import annotations

import heapq
from dataclasses import dataclass

__all__ = ["WorkItem", "cost", "balance", "tenants_to_split"]


@dataclass(frozen=True)
class WorkItem:
    """A unit of work for one rank: a whole tenant (``tree=None``) or one tree of a split tenant."""

    tenant: str
    size: int  # nodes
    tree: int | None = None  # tenant-local cluster id of the tree


def cost(n: int) -> int:
    """Work of compressing ``n`` nodes: partition and spanning trees grow like n^2."""
    return n * n


def balance(items: list[WorkItem], world: int) -> list[list[WorkItem]]:
    """Longest-processing-time-first: items by cost, largest first (ties: tenant, tree),
    each to the least-loaded rank (ties: lowest rank). Deterministic.

    Shape: items (I,) -> world lists, their concatenation a permutation of items
    """
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise ValueError(f"world must be an integer >= 1, got {world!r}")
    order = sorted(items, key=lambda it: (-cost(it.size), it.tenant, -1 if it.tree is None else it.tree))
    heap = [(0, r) for r in range(world)]
    out: list[list[WorkItem]] = [[] for _ in range(world)]
    for it in order:
        load, r = heapq.heappop(heap)
        out[r].append(it)
        heapq.heappush(heap, (load + cost(it.size), r))
    return out


def tenants_to_split(sizes: dict[str, int], world: int, split_above: int | None) -> list[str]:
    """Tenants whose trees are spread over ranks. ``split_above=None``: those whose cost
    alone exceeds a fair share (total / world) when there are several ranks; otherwise those
    with more than ``split_above`` nodes. In first-appearance order."""
    if world == 1 and split_above is None:
        return []
    if split_above is None:
        fair = sum(cost(n) for n in sizes.values()) / world
        return [t for t, n in sizes.items() if cost(n) > fair and n > 1]
    return [t for t, n in sizes.items() if n > split_above]
