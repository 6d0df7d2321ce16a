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
                    ok: torch.Tensor, m: int, cap: torch.Tensor | None = None) -> torch.Tensor:
    """Greedy matching per tree, then keep only its ``cap`` best edges (which is exactly
    what a greedy matching stopped after ``cap`` picks would hold).

    Shape: u, v, score, key, ok (B, E); cap (B,) -> matched (B, E) bool
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
    while bool(avail.any()):
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
        brow = torch.arange(B, device=dev)[:, None].expand(B, E)
        used[brow[take], u[take]] = True
        used[brow[take], v[take]] = True
        avail = avail & ~take & ~used.gather(1, u) & ~used.gather(1, v)
    if cap is not None:
        # rank matched edges by (score desc, key asc) and keep the first cap[b]
        s = torch.where(matched, score, neg)
        order = torch.argsort(torch.where(matched, key, torch.full_like(key, big)), dim=1, stable=True)
        s_o = s.gather(1, order)
        order2 = torch.argsort(s_o, dim=1, descending=True, stable=True)
        ranked = order.gather(1, order2)  # edge ids best first
        rank = torch.empty_like(ranked)
        rank.scatter_(1, ranked, torch.arange(E, device=dev).expand(B, E).contiguous())
        matched &= rank < cap[:, None]
    return matched
