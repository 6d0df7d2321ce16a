"""Semantic + temporal reassignment of points to cluster centres (SPEC section 1, step 3).

Points are laid out in time order inside each problem (column = position), so the
temporal window of a point is simply the columns ``p - window .. p + window``.
"""
from __future__ import annotations

import torch

from .assign import best_match

__all__ = ["reassign_to_centres", "TIE_TOL"]

TIE_TOL = 1e-6  # scores within this are ties; a point keeps its k-means label when tied for the best


def reassign_to_centres(X: torch.Tensor, valid: torch.Tensor, labels: torch.Tensor, centre: torch.Tensor, *,
                        beta: float = 0.8, window: int = 5, use_semantic: bool = True,
                        use_temporal: bool = True, budget: int = 1 << 24,
                        semantic: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Move each non-centre point to the centre maximising
    ``u = beta * cos(x, c) + (1 - beta) * [|pos_x - pos_c| <= window]``.

    Ties: keep the k-means label if its centre is among the best (within ``TIE_TOL``),
    else the lowest cluster id. Centres stay in their own cluster. Rows of X must be
    L2-normalised and in time order (column = position).

    ``semantic``: a precomputed (cos, cluster) of each point's most similar centre, for
    callers that search centres approximately (two-level partitioning); default exact.

    Shape: X (T, n, D), valid (T, n), labels (T, n), centre (T, K) point index or -1
           -> labels (T, n)
    """
    T, n, D = X.shape
    K = centre.shape[1]
    dev = X.device
    rows = torch.arange(T, device=dev)
    sem_w = float(beta) if use_semantic else 0.0
    tmp_w = float(1.0 - beta) if use_temporal else 0.0
    c_valid = centre >= 0  # (T, K)
    Cx = X[rows[:, None], centre.clamp(min=0)]  # (T, K, D)

    # (a) best centre by the semantic term alone (tiled running argmax)
    if sem_w > 0:
        s1, j1 = semantic if semantic is not None else best_match(X, Cx, c_valid, mode="dot", budget=budget)
        u1 = sem_w * s1  # (T, n)
    else:  # every centre scores 0: the lowest valid cluster id
        j1 = c_valid.float().argmax(1)[:, None].expand(T, n).clone()
        u1 = torch.zeros(T, n, device=dev)

    # (b) best centre inside the window, with the temporal bonus
    cluster_at = torch.full((T, n), -1, dtype=torch.int64, device=dev)  # cluster whose centre sits at column
    t_idx, k_idx = c_valid.nonzero(as_tuple=True)
    cluster_at[t_idx, centre[t_idx, k_idx]] = k_idx
    cols = torch.arange(n, device=dev)
    u2 = torch.full((T, n), float("-inf"), device=dev)
    j2 = torch.full((T, n), K, dtype=torch.int64, device=dev)
    own_u = torch.full((T, n), float("-inf"), device=dev)
    own_c = labels.clamp(min=0)
    own_cx = Cx[rows[:, None], own_c]  # (T, n, D)
    own_cos = (X * own_cx).sum(-1)  # (T, n)
    own_pos = centre[rows[:, None], own_c]  # (T, n)
    own_in = (own_pos - cols[None, :]).abs() <= window
    own_u = sem_w * own_cos + tmp_w * own_in.float()
    if tmp_w > 0 or sem_w > 0:
        for d in range(-window, window + 1):
            nb = cols + d  # (n,)
            ok = (nb >= 0) & (nb < n)
            nbc = nb.clamp(0, n - 1)
            c_at = cluster_at[:, nbc]  # (T, n)
            has = ok[None, :] & (c_at >= 0) & valid
            ti, ni = has.nonzero(as_tuple=True)  # only points with a centre at offset d (a few %)
            if ti.numel() == 0:
                continue
            cos = (X[ti, ni] * X[ti, nbc[ni]]).sum(-1)  # (P,)
            u = sem_w * cos + tmp_w
            c, cur_u, cur_j = c_at[ti, ni], u2[ti, ni], j2[ti, ni]
            better = (u > cur_u + TIE_TOL) | ((u >= cur_u - TIE_TOL) & (c < cur_j))
            u2[ti[better], ni[better]] = u[better]
            j2[ti[better], ni[better]] = c[better]

    # window and semantic candidates compare with the same tolerance as best_match's ties
    take2 = (u2 > u1 + TIE_TOL) | ((u2 >= u1 - TIE_TOL) & (j2 < j1))
    best_u = torch.where(take2, u2, u1)
    best_j = torch.where(take2, j2, j1)
    keep = own_u >= best_u - TIE_TOL
    out = torch.where(keep, labels, best_j)
    is_centre = cluster_at >= 0
    out = torch.where(is_centre, cluster_at, out)
    return out.masked_fill(~valid, -1)
