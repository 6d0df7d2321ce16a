"""Tiled best-match search: for every point, the best of its own problem's centres.

Never materialises the full (n, K) score matrix: rows are processed in tiles sized so a
tile's (T, rows, K) scores stay under ``tile_elements`` elements, keeping a running argmax.
"""
from __future__ import annotations

import torch

from .best_match_rule import MODES, TIE_EPS, check_best_match_args

__all__ = ["best_match", "best_score"]


def _rows_per_tile(T: int, n: int, K: int, tile_elements: int) -> int:
    return max(1, min(n, tile_elements // max(1, T * K)))


def best_match(X: torch.Tensor, C: torch.Tensor, c_valid: torch.Tensor, *, mode: str = "l2",
               tile_elements: int = 1 << 24, backend: str = "auto", runner: bool = False):
    """Best centre per point, batched over independent problems.

    mode "l2": nearest centre in Euclidean distance (score = 2 x.c - |c|^2, higher is better);
    mode "dot": largest dot product. Ties go to the lowest centre index, where scores
    within ``TIE_EPS`` of the best count as tied (identical centres get scores a few ulps
    apart out of a matrix multiply); invalid centres never win. A problem with no valid
    centre gets index -1 and score -inf.

    ``backend``: "torch" (this function, the reference), "triton" (the fused kernel of
    :mod:`.triton_assign`), or "auto": Triton on CUDA when it is installed (set
    ``MEMFOREST_TRITON=0`` to turn it off), else torch; on CUDA every fallback is recorded with
    its reason (:func:`.triton_assign.fallback_reasons`).

    ``runner=True`` (the torch path only) also returns each point's runner-up: the best score of
    the other centres (-inf where there is none), from the same products, so the same bits.

    Shape: X (T, n, D), C (T, K, D), c_valid (T, K) -> score (T, n), index (T, n) int64
           (and runner (T, n) float32 with ``runner=True``)
    """
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"backend must be one of ['auto', 'torch', 'triton'], got {backend!r}")
    if runner and backend == "triton":
        raise ValueError("runner=True needs the torch backend")
    if backend != "torch" and not runner and mode in MODES:
        from .triton_assign import try_best_match_triton

        out = try_best_match_triton(X, C, c_valid, mode=mode, backend=backend)
        if out is not None:
            return out
    check_best_match_args(X, C, mode)
    T, n, D = X.shape
    K = C.shape[1]
    score = torch.full((T, n), float("-inf"), dtype=torch.float32, device=X.device)
    index = torch.full((T, n), -1, dtype=torch.int64, device=X.device)
    second = torch.full((T, n), float("-inf"), dtype=torch.float32, device=X.device) if runner else None
    if K == 0 or n == 0:
        return (score, index, second) if runner else (score, index)
    bias, scale = _bias(C, c_valid, mode)  # (T, K)
    Ct = C.transpose(1, 2)  # (T, D, K)
    rows = _rows_per_tile(T, n, K, tile_elements)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        s = torch.baddbmm(bias[:, None, :], X[:, r0:r1], Ct, beta=1.0, alpha=scale)  # (T, rows, K)
        v = s.max(dim=2).values  # (T, rows)
        # lowest index within TIE_EPS of the best: duplicate centres score a few ulps apart
        j = (s >= (v - TIE_EPS)[:, :, None]).to(torch.uint8).argmax(dim=2)
        j = torch.where(torch.isfinite(v), j, torch.full_like(j, -1))
        score[:, r0:r1] = v
        index[:, r0:r1] = j
        if runner:  # the best of the other columns: the winner's score set to -inf (s is this tile's own)
            second[:, r0:r1] = s.scatter_(2, j.clamp(min=0)[:, :, None], float("-inf")).max(dim=2).values
    return (score, index, second) if runner else (score, index)


def _bias(C: torch.Tensor, c_valid: torch.Tensor, mode: str) -> tuple[torch.Tensor, float]:
    """What a score adds to ``scale * x.c``: -|c|^2 for "l2" (scale 2), 0 for "dot" (scale 1),
    -inf for an invalid centre. Shape: C (T, K, D), c_valid (T, K) -> bias (T, K), scale"""
    bias = torch.zeros(C.shape[:2], dtype=torch.float32, device=C.device)
    if mode == "l2":
        bias = bias - (C.float() * C.float()).sum(-1)
    return bias.masked_fill(~c_valid, float("-inf")), (2.0 if mode == "l2" else 1.0)


def best_score(X: torch.Tensor, C: torch.Tensor, c_valid: torch.Tensor, *, mode: str = "l2",
               tile_elements: int = 1 << 24, backend: str = "auto") -> torch.Tensor:
    """The score of :func:`best_match` alone, the same bits, without finding which centre
    gives it (the tie rule's pass and the argmax are skipped: the D^2 seeding and the
    settled-row bound need only the score). ``backend`` as in :func:`best_match`: on CUDA the
    Triton kernel gives both at once, so it runs as it is.

    Shape: X (T, n, D), C (T, K, D), c_valid (T, K) -> score (T, n) float32 (-inf where a
           problem has no valid centre)
    """
    if backend not in ("auto", "torch", "triton"):
        raise ValueError(f"backend must be one of ['auto', 'torch', 'triton'], got {backend!r}")
    if backend == "triton" or (backend == "auto" and X.is_cuda):
        return best_match(X, C, c_valid, mode=mode, tile_elements=tile_elements, backend=backend)[0]
    check_best_match_args(X, C, mode)
    T, n, _ = X.shape
    K = C.shape[1]
    score = torch.full((T, n), float("-inf"), dtype=torch.float32, device=X.device)
    if K == 0 or n == 0:
        return score
    bias, scale = _bias(C, c_valid, mode)  # (T, K)
    Ct = C.transpose(1, 2)  # (T, D, K)
    rows = _rows_per_tile(T, n, K, tile_elements)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        score[:, r0:r1] = torch.baddbmm(bias[:, None, :], X[:, r0:r1], Ct, beta=1.0, alpha=scale).max(dim=2).values
    return score
