"""Semantic + temporal reassignment of points to cluster centres (docs/method.md section 1, step 3).

Points are laid out in time order inside each problem (column = position), so the
temporal window of a point is simply the columns ``p - window .. p + window``.
"""
from __future__ import annotations

import torch

from .assign import best_match
from .blocks import row_blocks

__all__ = ["reassign_to_centres", "TIE_TOL"]

TIE_TOL = 1e-6  # scores within this are ties; a point keeps its k-means label when tied for the best


def reassign_to_centres(X: torch.Tensor, valid: torch.Tensor, labels: torch.Tensor, centre: torch.Tensor, *,
                        beta: float = 0.8, window: int = 5, use_semantic: bool = True,
                        use_temporal: bool = True, tile_elements: int = 1 << 24,
                        semantic: tuple[torch.Tensor, torch.Tensor] | None = None,
                        rows: torch.Tensor | None = None) -> torch.Tensor:
    """Move each non-centre point to the centre maximising
    ``u = beta * cos(x, c) + (1 - beta) * [|pos_x - pos_c| <= window]``.

    Ties: keep the k-means label if its centre is among the best (within ``TIE_TOL``),
    else the lowest cluster id. Centres stay in their own cluster. Rows of X must be
    L2-normalised and in time order (column = position).

    ``semantic``: a precomputed (cos, cluster) of each point's most similar centre, for
    callers that search centres approximately (two-level partitioning); default exact.
    ``rows`` (needs ``semantic``): point ``(t, j)`` is ``X[rows[t, j]]``, so no (T, n, D) copy
    of the points is made; no (T, n, D) temporary either way (``tile_elements`` elements at a time).

    Shape: X (T, n, D), or X (N, D) with rows (T, n); valid (T, n), labels (T, n),
           centre (T, K) point index or -1 -> labels (T, n)
    """
    if rows is not None and semantic is None:
        raise ValueError("semantic must be given with rows (the exact semantic search needs the (T, n, D) points)")
    pts = _points(X, rows)  # padding rows (< 0) read row 0: masked out at the end
    T, n = valid.shape
    K = centre.shape[1]
    dev = X.device
    t_ar = torch.arange(T, device=dev)
    sem_w = float(beta) if use_semantic else 0.0
    tmp_w = float(1.0 - beta) if use_temporal else 0.0
    c_valid = centre >= 0  # (T, K)
    Cx = pts(t_ar[:, None], centre.clamp(min=0))  # (T, K, D)

    # (a) best centre by the semantic term alone (tiled running argmax)
    if sem_w > 0:
        s1, j1 = semantic if semantic is not None else best_match(X, Cx, c_valid, mode="dot",
                                                                  tile_elements=tile_elements)
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
    own_cos = _own_cosines(X, rows, Cx, own_c, tile_elements)  # (T, n)
    own_pos = centre[t_ar[:, None], own_c]  # (T, n)
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
            cos = (pts(ti, ni) * pts(ti, nbc[ni])).sum(-1)  # (P,)
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


def _own_cosines(X: torch.Tensor, rows: torch.Tensor | None, Cx: torch.Tensor, own_c: torch.Tensor,
                 tile_elements: int) -> torch.Tensor:
    """Each point's cosine to its own cluster's centre, a block of points at a time (no
    (T, n, D) temporary): the same elementwise products and one sum over D per point whatever
    the block (see :func:`~.blocks.row_blocks`). Shape: Cx (T, K, D), own_c (T, n) -> (T, n)"""
    T, n = own_c.shape
    t_ar = torch.arange(T, device=own_c.device)[:, None]
    out = torch.empty(T, n, dtype=Cx.dtype, device=own_c.device)
    for cs in row_blocks(n, tile_elements // max(1, T * Cx.shape[2])):
        blk = X[:, cs] if rows is None else X[rows[:, cs].clamp(min=0)]  # (T, block, D)
        out[:, cs] = (blk * Cx[t_ar, own_c[:, cs]]).sum(-1)
    return out


def _points(X: torch.Tensor, rows: torch.Tensor | None):
    """``(t, j) -> vectors`` of the points at index tensors ``t``, ``j``: ``X[t, j]``, or with
    ``rows``, ``X[rows[t, j]]`` (the same values)."""
    if rows is None:
        return lambda t, j: X[t, j]
    r = rows.clamp(min=0)
    return lambda t, j: X[r[t, j]]
