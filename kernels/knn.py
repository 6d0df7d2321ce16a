"""Nearest-neighbour candidates inside many point sets at once (one set = one tree).

- :func:`knn_blockwise`: the exact top-c of every point by ``scale * x_i . x_j + bias_j``,
  in row blocks (a (B, rows, m) score block at a time, never the (B, m, m) matrix). The
  bias and scale ride inside the matrix multiply as one extra column, so a block costs
  one batched product and one top-c.
- :func:`knn_cells`: the same, approximate, for big sets: each set is cut into cells of
  equal size by recursive halving along the principal direction; a cell's points search
  the members of the ``probe`` cells whose centroids are nearest its own.
- :func:`top_by_key` : the k best of each row by (weight desc, column asc), exact ties
  (an integer key per entry, so no tie is left to the sort).

Candidates are a superset to re-rank exactly (the caller computes the exact weights of the
few pairs kept); scores here are float32.
"""
from __future__ import annotations

import torch

__all__ = ["order_key", "top_by_key", "knn_blockwise", "knn_cells", "balanced_cells"]

NO_SCORE = -1.0e30  # bias of a missing point: below every real score, never NaN


def order_key(w: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
    """int64 keys that order float ``w`` descending, then ``col`` ascending: a larger key is
    better, and keys of different (w, col) never tie. Shape: w, col (...) -> (...) int64"""
    b = (w.float() + 0.0).contiguous().view(torch.int32).to(torch.int64)  # + 0.0: -0.0 ties with 0.0
    b = torch.where(b < 0, b ^ 0x7FFFFFFF, b)  # IEEE floats ordered as signed integers
    return (b << 32) | (0xFFFFFFFF - col.to(torch.int64))


def top_by_key(w: torch.Tensor, col: torch.Tensor, k: int):
    """The ``k`` best entries of each row by (w desc, col asc); -inf entries come back as
    column -1. Rows with fewer than k entries are padded with -1 / -inf (position 0).

    Shape: w, col (..., c) -> col (..., k) int64, w (..., k), position in the row (..., k) int64
    """
    c = w.shape[-1]
    kk = min(k, c)
    _, j = torch.topk(order_key(w, col), kk, dim=-1)
    cols, ww = col.gather(-1, j), w.gather(-1, j)
    cols = torch.where(torch.isneginf(ww), torch.full_like(cols, -1), cols)
    if kk < k:
        pad = tuple(cols.shape[:-1]) + (k - kk,)
        cols = torch.cat([cols, cols.new_full(pad, -1)], -1)
        ww = torch.cat([ww, ww.new_full(pad, float("-inf"))], -1)
        j = torch.cat([j, j.new_zeros(pad)], -1)
    return cols, ww, j


def _augment(X: torch.Tensor, valid: torch.Tensor, scale: float, bias: torch.Tensor | None):
    """Query rows [scale * x, 1] and key rows [x, bias] (NO_SCORE where invalid), float32."""
    Xf = X.float() * valid[..., None]
    one = torch.ones(Xf.shape[:-1] + (1,), dtype=torch.float32, device=X.device)
    b = torch.zeros_like(one[..., 0]) if bias is None else bias.float()
    b = torch.where(valid, b, torch.full_like(b, NO_SCORE))
    return torch.cat([Xf * scale, one], -1), torch.cat([Xf, b[..., None]], -1)


def knn_blockwise(X: torch.Tensor, valid: torch.Tensor, c: int, *, scale: float = 1.0,
                  bias: torch.Tensor | None = None, tile_elements: int = 1 << 24) -> torch.Tensor:
    """Top-``c`` other valid points of each point of its own set by ``scale * x_i.x_j + bias_j``.

    Rows are scored in blocks whose size depends on m and ``tile_elements`` only (never on B), so
    a set's candidates do not depend on the other sets of the batch.

    Shape: X (B, m, D), valid (B, m), bias (B, m) or None -> (B, m, c) int64 column (-1 none)
    """
    B, m, _ = X.shape
    out = torch.full((B, m, c), -1, dtype=torch.int64, device=X.device)
    if B == 0 or m < 2 or c == 0:
        return out
    Q, K = _augment(X, valid, scale, bias)
    Kt = K.transpose(1, 2)  # (B, D+1, m)
    rows = max(1, min(m, tile_elements // m))
    cc = min(c + 1, m)  # one more: the point itself is among its own best
    for r0 in range(0, m, rows):
        r1 = min(m, r0 + rows)
        S = torch.bmm(Q[:, r0:r1], Kt)  # (B, r, m)
        _, j = torch.topk(S, cc, dim=-1)  # (B, r, cc)
        out[:, r0:r1] = _drop_self(j, torch.arange(r0, r1, device=X.device)[None, :, None], S.gather(-1, j), c)
    return torch.where(valid[..., None], out, torch.full_like(out, -1))


def _drop_self(j: torch.Tensor, me: torch.Tensor, s: torch.Tensor, c: int) -> torch.Tensor:
    """The first ``c`` of each row's candidates other than the point itself, -1 for scores
    of missing points. Shape: j, s (..., cc), me broadcastable -> (..., c)"""
    bad = (j == me) | (s <= NO_SCORE / 2)
    key = torch.where(bad, torch.full_like(j, -1), j)
    rank = torch.argsort(bad.to(torch.int8), dim=-1, stable=True)[..., :c]  # good ones first, in score order
    out = key.gather(-1, rank)
    if out.shape[-1] < c:
        out = torch.cat([out, out.new_full(tuple(out.shape[:-1]) + (c - out.shape[-1],), -1)], -1)
    return out


def balanced_cells(X: torch.Tensor, valid: torch.Tensor, levels: int) -> torch.Tensor:
    """Cut each set's valid points into ``2**levels`` cells of equal size (within one): a k-d
    tree over the set's top principal components (level l halves every cell at the median of
    component l), so cells are compact where the points spread most. Deterministic.

    Shape: X (B, m, D), valid (B, m) -> members (B, L, s) point index (-1 = padding), L = 2**levels
    """
    B, m, D = X.shape
    dev = X.device
    L = 1 << levels
    s = -(-m // L) * L
    Xf = X.float() * valid[..., None]
    mu = Xf.sum(1, keepdim=True) / valid.sum(1).clamp(min=1)[:, None, None].float()  # (B, 1, D)
    cov = torch.bmm(Xf.transpose(1, 2), Xf) / max(m, 1) - mu.transpose(1, 2) @ mu  # (B, D, D)
    _, vec = torch.linalg.eigh(cov.double())  # ascending eigenvalues
    P = max(1, min(levels, D))
    proj = torch.bmm(Xf - mu, vec[:, :, D - P:].flip(-1).float())  # (B, m, P) top components first
    idx = torch.where(valid, torch.arange(m, device=dev).expand(B, m), -1)
    idx = idx.gather(1, torch.argsort((~valid).to(torch.int8), dim=1, stable=True))  # valid first
    mem = torch.full((B, 1, s), -1, dtype=torch.int64, device=dev)
    mem[:, 0, :m] = idx
    bi = torch.arange(B, device=dev)[:, None, None]
    for lev in range(levels):
        C, n = mem.shape[1], mem.shape[2]
        ok = mem >= 0
        p = proj[bi, mem.clamp(min=0), lev % P].masked_fill(~ok, float("inf"))  # (B, C, n)
        mem = mem.gather(2, torch.argsort(p, dim=-1, stable=True))
        cnt = ok.sum(-1, keepdim=True)  # valid points, first in each row
        h = (cnt + 1) // 2
        pos = torch.arange(n // 2, device=dev)
        lo = torch.where(pos < h, mem[..., : n // 2], -1)
        hi = torch.where(pos < cnt - h, mem.gather(2, (h + pos).clamp(max=n - 1)), -1)
        mem = torch.stack([lo, hi], 2).reshape(B, 2 * C, n // 2)
    return mem


def knn_cells(X: torch.Tensor, valid: torch.Tensor, c: int, *, scale: float = 1.0,
              bias: torch.Tensor | None = None, cell: int = 256, probe: int = 8,
              tile_elements: int = 1 << 24) -> torch.Tensor:
    """Approximate :func:`knn_blockwise`: cells of about ``cell`` points
    (:func:`balanced_cells`); each cell's points score the members of the ``probe`` cells
    nearest it (by centroid cosine, its own first).

    Shape: X (B, m, D), valid (B, m), bias (B, m) or None -> (B, m, c) int64 column (-1 none)
    """
    B, m, D = X.shape
    dev = X.device
    levels = max(0, (max(1, m // cell)).bit_length() - 1)
    mem = balanced_cells(X, valid, levels)  # (B, L, s)
    L, s = mem.shape[1], mem.shape[2]
    probe = min(probe, L)
    bi = torch.arange(B, device=dev)[:, None, None]
    ok = mem >= 0
    Q, K = _augment(X, valid, scale, bias)  # (B, m, D+1)
    Qs, Ks = Q[bi, mem.clamp(min=0)], K[bi, mem.clamp(min=0)]  # (B, L, s, D+1): points in cell order
    Ks[..., -1] = torch.where(ok, Ks[..., -1], torch.full_like(Ks[..., -1], NO_SCORE))
    cen = torch.nn.functional.normalize(Ks[..., :-1].sum(2), dim=-1)  # (B, L, D)
    cs = torch.bmm(cen, cen.transpose(1, 2))  # (B, L, L)
    cs.diagonal(dim1=1, dim2=2).fill_(float("inf"))
    near = torch.topk(cs, probe, dim=-1).indices  # (B, L, probe), its own cell first
    out = torch.full((B, m, c), -1, dtype=torch.int64, device=dev)
    step = max(1, tile_elements // max(1, B * s * probe * s))
    cc = min(c + 1, probe * s)
    for l0 in range(0, L, step):
        l1 = min(L, l0 + step)
        nb = near[:, l0:l1]  # (B, Lc, probe)
        kk = Ks[bi, nb].flatten(2, 3)  # (B, Lc, probe*s, D+1): whole cells, no row gather
        ci = mem[bi, nb].flatten(2, 3)  # (B, Lc, probe*s)
        qi = mem[:, l0:l1]
        S = torch.matmul(Qs[:, l0:l1], kk.transpose(-1, -2))  # (B, Lc, s, probe*s)
        _, j = torch.topk(S, cc, dim=-1)
        cols = _drop_self(ci[:, :, None, :].expand_as(S).gather(-1, j), qi[..., None], S.gather(-1, j), c)
        sel = qi >= 0
        out[bi.expand_as(qi)[sel], qi[sel]] = cols[sel]
    return torch.where(valid[..., None], out, torch.full_like(out, -1))
