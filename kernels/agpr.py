"""Retrieval scoring: plain top-k and Anchor-Guided Propagation Retrieval (docs/method.md
section 4)."""
from __future__ import annotations

import math

import torch

__all__ = ["topk_search", "topk_rows", "topk_search_sorted", "dense_rank", "agpr_rerank", "n_anchors"]


def n_anchors(k: int, lam: float) -> int:
    """max(1, floor(lam * k + 0.5))"""
    return max(1, int(math.floor(lam * k + 0.5)))


def topk_search(Qe: torch.Tensor, X: torch.Tensor, c: int, *, valid: torch.Tensor | None = None,
                tile_elements: int = 1 << 26):
    """The ``c`` most similar rows of X per query, most similar first (ties: lower index).

    Linear in N per query (a partial top-c plus an exact tie rule, no full sort), and the
    (Q, N) similarities are held for at most ``tile_elements`` elements' worth of queries at a time.
    :func:`topk_search_sorted` is the full-sort reference.

    Shape: Qe (Q, D), X (N, D), valid (Q, N) -> sims (Q, c'), index (Q, c') with c' = min(c, N);
           index -1 (and sim -inf) where fewer valid rows exist
    """
    Q, N = Qe.shape[0], X.shape[0]
    c = min(c, N)
    vals = torch.empty(Q, c, dtype=torch.float32, device=Qe.device)
    idx = torch.empty(Q, c, dtype=torch.int64, device=Qe.device)
    step = max(1, tile_elements // max(1, N))
    Xt = X.float().T
    for q0 in range(0, Q, step):
        S = Qe[q0:q0 + step].float() @ Xt  # (Qc, N)
        if valid is not None:
            S = S.masked_fill(~valid[q0:q0 + step], float("-inf"))
        if c == 0:
            continue
        vals[q0:q0 + step], idx[q0:q0 + step] = topk_rows(S, c)
    idx = torch.where(torch.isfinite(vals), idx, torch.full_like(idx, -1))
    return vals, idx


def topk_rows(S: torch.Tensor, c: int):
    """The ``c`` largest entries of each row of a score matrix, largest first, ties to the
    lower column (a partial top-c plus an exact tie rule, no full sort). -inf entries are
    returned as they are (callers mark them -1).

    Shape: S (Q, N), 1 <= c <= N -> vals (Q, c), cols (Q, c) int64
    """
    tv, cols = torch.topk(S, c, dim=1)  # (Q, c); which of equal values it returns is unspecified
    thr = tv[:, -1:]  # the c-th largest value
    amb = (thr <= S).sum(1) > c  # more rows tie at the threshold than fit: pick the lowest indices
    if bool(amb.any()):
        Sa = S[amb]
        above, tied = Sa > thr[amb], Sa == thr[amb]
        need = c - above.sum(1, keepdim=True)
        sel = above | (tied & (torch.cumsum(tied, 1) <= need))  # exactly c per query
        cols[amb] = sel.nonzero(as_tuple=True)[1].view(-1, c)
    cols = torch.sort(cols, dim=1).values  # index order, so a stable sort by value breaks ties by index
    sv = S.gather(1, cols)
    order = torch.sort(sv, dim=1, descending=True, stable=True).indices  # equal values keep index order
    return sv.gather(1, order), cols.gather(1, order)


def topk_search_sorted(Qe: torch.Tensor, X: torch.Tensor, c: int, *, valid: torch.Tensor | None = None):
    """Reference for :func:`topk_search`: one stable full sort of the (Q, N) similarities."""
    N = X.shape[0]
    c = min(c, N)
    S = Qe.float() @ X.float().T  # (Q, N)
    if valid is not None:
        S = S.masked_fill(~valid, float("-inf"))
    vals, idx = torch.sort(S, dim=1, descending=True, stable=True)
    vals, idx = vals[:, :c], idx[:, :c]
    idx = torch.where(torch.isfinite(vals), idx, torch.full_like(idx, -1))
    return vals, idx


def dense_rank(t: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Dense rank of each row's values (equal values share a rank; invalid entries rank last).

    Shape: t (Q, C), valid (Q, C) -> rank (Q, C) int64
    """
    big = torch.finfo(t.dtype).max if t.is_floating_point() else torch.iinfo(t.dtype).max
    tt = torch.where(valid, t, torch.full_like(t, big))
    srt, order = torch.sort(tt, dim=1, stable=True)
    step = torch.zeros_like(order)
    step[:, 1:] = (srt[:, 1:] != srt[:, :-1]).long()
    r = torch.cumsum(step, 1)
    rank = torch.empty_like(r)
    rank.scatter_(1, order, r)
    return rank


def agpr_rerank(sims: torch.Tensor, times: torch.Tensor, valid: torch.Tensor, k: int, *, lam: float = 0.2,
                gamma: float = 0.9):
    """Re-rank candidates (sorted by similarity, best first) with AGPR and keep ``k``.

    anchors = the first max(1, floor(lam*k + 0.5)) candidates; pos = dense time rank among
    the candidates; p_j = mean_a exp(-|pos_j - pos_a|); v = gamma*s + (1-gamma)*p.
    Ties: higher s, then lower candidate column (= lower index for equal s).

    Shape: sims, times, valid (Q, C) -> order (Q, k') column indices into C, v (Q, k'), k' =
           min(k, C)
    """
    Q, C = sims.shape
    A = min(n_anchors(k, lam), C)
    pos = dense_rank(times, valid).to(sims.dtype)  # (Q, C)
    pa = pos[:, :A]  # (Q, A)
    a_ok = valid[:, :A]  # (Q, A)
    dist = (pos[:, :, None] - pa[:, None, :]).abs()  # (Q, C, A)
    dist = torch.where(a_ok[:, None, :], dist, torch.full_like(dist, float("inf")))  # exp(-inf) = 0
    # sum in a canonical order, so candidates with the same distances get the same p exactly
    prox = torch.exp(-torch.sort(dist, dim=-1).values.double())
    p = (prox.sum(-1) / a_ok.sum(-1, keepdim=True).clamp(min=1)).to(sims.dtype)  # (Q, C)
    v = gamma * sims + (1.0 - gamma) * p
    v = torch.where(valid, v, torch.tensor(float("-inf"), dtype=v.dtype, device=v.device))
    # tie order: v desc, then s desc, then column asc (stable sorts, last key first)
    o1 = torch.argsort(sims.masked_fill(~valid, float("-inf")), dim=1, descending=True, stable=True)
    o2 = torch.argsort(v.gather(1, o1), dim=1, descending=True, stable=True)
    order = o1.gather(1, o2)[:, : min(k, C)]
    return order, v.gather(1, order)
