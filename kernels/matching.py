"""Choosing which tree edges to merge in a round.

- :func:`best_edge_per_tree`: the single best eligible edge of each tree (sequential schedule).
- :func:`greedy_matching`: the greedy maximum-score matching of each tree's eligible
  edges (matching schedule), computed with the locally-dominant-edge rule: an edge that
  is the best remaining edge of both its endpoints is taken, its endpoints' other edges
  are dropped, repeat. Under a strict total order this equals the sequential greedy
  matching, but runs as a few tensor rounds instead of a loop over edges.

Edges are ordered by (score descending, tie key ascending).
"""
from __future__ import annotations

import torch

__all__ = ["best_edge_per_tree", "greedy_matching"]


def best_edge_per_tree(score: torch.Tensor, key: torch.Tensor, ok: torch.Tensor) -> torch.Tensor:
    """Index of the best eligible edge per tree, -1 where none.

    Shape: score, key, ok (B, E) -> (B,) int64
    """
    B, E = score.shape
    if E == 0:
        return torch.full((B,), -1, dtype=torch.int64, device=score.device)
    s = torch.where(ok, score, torch.tensor(float("-inf"), dtype=score.dtype, device=score.device))
    top = s.max(dim=1, keepdim=True).values  # (B, 1)
    big = torch.iinfo(torch.int64).max
    k = torch.where(ok & (s == top), key, torch.full_like(key, big))
    j = k.argmin(dim=1)
    return torch.where(ok.any(1), j, torch.full_like(j, -1))


def greedy_matching(u: torch.Tensor, v: torch.Tensor, score: torch.Tensor, key: torch.Tensor,
                    ok: torch.Tensor, m: int, cap: torch.Tensor | None = None, *, group: torch.Tensor | None = None,
                    check_every: int = 8) -> torch.Tensor:
    """Greedy matching per tree, then keep only its ``cap`` best edges (which is exactly
    what a greedy matching stopped after ``cap`` picks would hold).

    A row may hold many trees at once (the engine flattens every tree of a round into one
    row): vertex ids are then global and ``group`` (B, E) names each edge's tree, with
    ``cap`` (G,) per tree; without ``group`` each row is one tree and ``cap`` is (B,).
    Tie keys only need to be unique within a tree (edges of different trees never share a
    vertex, so they are never compared).

    The host reads one flag every ``check_every`` locally-dominant rounds (usually once in
    all: random trees need a handful of rounds).

    Shape: u, v, score, key, ok (B, E) with vertex ids in [0, m); cap (B,) or (G,) -> matched
           (B, E) bool
    """
    B, E = u.shape
    dev = u.device
    matched = torch.zeros(B, E, dtype=torch.bool, device=dev)
    if E == 0:
        return matched
    big = torch.iinfo(torch.int64).max
    neg = torch.tensor(float("-inf"), dtype=score.dtype, device=dev)
    avail = ok.clone()
    used = torch.zeros(B, m, dtype=torch.bool, device=dev)
    while True:
        for _ in range(check_every):
            s = torch.where(avail, score, neg)
            vbest = torch.full((B, m), float("-inf"), dtype=score.dtype, device=dev)
            vbest = vbest.scatter_reduce(1, u, s, "amax").scatter_reduce(1, v, s, "amax")  # (B, m)
            top_u = avail & (s == vbest.gather(1, u))
            top_v = avail & (s == vbest.gather(1, v))
            kk = torch.where(avail, key, torch.full_like(key, big))
            vkey = torch.full((B, m), big, dtype=torch.int64, device=dev)
            vkey = vkey.scatter_reduce(1, u, torch.where(top_u, kk, torch.full_like(kk, big)), "amin")
            vkey = vkey.scatter_reduce(1, v, torch.where(top_v, kk, torch.full_like(kk, big)), "amin")
            take = avail & top_u & top_v & (vkey.gather(1, u) == key) & (vkey.gather(1, v) == key)
            matched |= take
            t = take.to(torch.int8)
            hit = torch.zeros(B, m, dtype=torch.int8, device=dev).scatter_add_(1, u, t).scatter_add_(1, v, t)
            used |= hit > 0
            avail = avail & ~take & ~used.gather(1, u) & ~used.gather(1, v)
        if not bool(avail.any()):
            break
    if cap is not None:
        # rank matched edges of each tree by (score desc, key asc) and keep the first cap of them
        grp = group if group is not None else torch.arange(B, device=dev)[:, None].expand(B, E)
        flat_m, flat_s, flat_k, flat_g = matched.reshape(-1), score.reshape(-1), key.reshape(-1), grp.reshape(-1)
        order = torch.argsort(torch.where(flat_m, flat_k, torch.full_like(flat_k, big)), stable=True)
        order = order[torch.argsort(torch.where(flat_m, flat_s, neg)[order], descending=True, stable=True)]
        order = order[torch.argsort(flat_g[order], stable=True)]  # by tree, then score desc, then key asc
        g_sorted = flat_g[order]
        first = torch.searchsorted(g_sorted, g_sorted)  # where each tree's run starts
        rank = torch.empty_like(order)
        rank[order] = torch.arange(order.shape[0], device=dev) - first
        keep = rank < cap.to(dev)[flat_g]
        matched = matched & keep.view(B, E)
    return matched
