"""Fused best-match in Triton: similarity + running argmax without writing the (n, K) scores.

Same contract as :func:`memforest_gpu.kernels.best_match` (its PyTorch reference and
fallback): for every point of every problem, the best valid centre, ties (scores within
``TIE_EPS``) to the lowest centre index. The kernel resolves ties per centre tile as it
walks them, so it can differ from the reference only for a chain of distinct scores
spread wider than ``TIE_EPS`` around the best, never for duplicate centres. One program handles BLOCK_N points of one problem and walks all centres
in BLOCK_K tiles, keeping the best score and index in registers.

Runs on CUDA, or anywhere under the Triton interpreter (``TRITON_INTERPRET=1``), which
is how CI checks it on a CPU.
"""
from __future__ import annotations

import os

import torch

__all__ = ["triton_available", "best_match_triton"]


def triton_available(device: torch.device | str) -> bool:
    """Triton can run here: CUDA present, or the interpreter switched on."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    dev = torch.device(device)
    return dev.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


_KERNEL = None


def _kernel():
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton
    import triton.language as tl

    @triton.jit
    def best_match_kernel(X, C, BIAS, OUT_V, OUT_I, n, K, D, scale, tie_eps,
                          sxt, sxn, sct, sck, sbt, sot,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
        t = tl.program_id(0)
        pid = tl.program_id(1)
        rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
        rmask = rows < n
        best_v = tl.full((BLOCK_N,), float("-inf"), tl.float32)
        best_i = tl.full((BLOCK_N,), -1, tl.int64)
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)  # (BLOCK_K,)
            cmask = cols < K
            acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
            for d0 in range(0, D, BLOCK_D):
                ds = d0 + tl.arange(0, BLOCK_D)
                dmask = ds < D
                x = tl.load(X + t * sxt + rows[:, None] * sxn + ds[None, :], mask=rmask[:, None] & dmask[None, :],
                            other=0.0)  # (BLOCK_N, BLOCK_D)
                c = tl.load(C + t * sct + cols[:, None] * sck + ds[None, :], mask=cmask[:, None] & dmask[None, :],
                            other=0.0)  # (BLOCK_K, BLOCK_D)
                acc += tl.dot(x, tl.trans(c), input_precision="ieee")
            b = tl.load(BIAS + t * sbt + cols, mask=cmask, other=float("-inf"))  # (BLOCK_K,)
            s = acc * scale + b[None, :]
            v = tl.max(s, axis=1)
            # first column within tie_eps of the max (lowest index on ties)
            is_max = s >= v[:, None] - tie_eps
            i = tl.min(tl.where(is_max, cols[None, :], K + BLOCK_K), axis=1).to(tl.int64)
            upd = v > best_v + tie_eps  # an earlier tile keeps a tie
            best_v = tl.where(upd, v, tl.maximum(best_v, v))
            best_i = tl.where(upd, i, best_i)
        tl.store(OUT_V + t * sot + rows, best_v, mask=rmask)
        tl.store(OUT_I + t * sot + rows, best_i, mask=rmask)

    _KERNEL = best_match_kernel
    return _KERNEL


def best_match_triton(X: torch.Tensor, C: torch.Tensor, c_valid: torch.Tensor, *, mode: str = "l2",
                      block_n: int = 64, block_k: int = 64, block_d: int = 32):
    """Triton version of :func:`best_match` (same arguments, same results).

    Shape: X (T, n, D), C (T, K, D), c_valid (T, K) -> score (T, n), index (T, n) int64
    """
    import triton

    if mode not in ("l2", "dot"):
        raise ValueError(f"mode must be one of ['l2', 'dot'], got {mode!r}")
    T, n, D = X.shape
    K = C.shape[1]
    Xc = X.float().contiguous()
    Cc = C.float().contiguous()
    bias = torch.zeros(T, K, dtype=torch.float32, device=X.device)
    if mode == "l2":
        bias = bias - (Cc * Cc).sum(-1)
    bias = bias.masked_fill(~c_valid, float("-inf")).contiguous()
    out_v = torch.full((T, n), float("-inf"), dtype=torch.float32, device=X.device)
    out_i = torch.full((T, n), -1, dtype=torch.int64, device=X.device)
    if n == 0 or K == 0 or T == 0:
        return out_v, out_i
    grid = (T, triton.cdiv(n, block_n))
    from .assign import TIE_EPS

    _kernel()[grid](Xc, Cc, bias, out_v, out_i, n, K, D, 2.0 if mode == "l2" else 1.0, TIE_EPS,
                    Xc.stride(0), Xc.stride(1), Cc.stride(0), Cc.stride(1), bias.stride(0), out_v.stride(0),
                    BLOCK_N=block_n, BLOCK_K=block_k, BLOCK_D=block_d)
    out_i = torch.where(torch.isfinite(out_v), out_i, torch.full_like(out_i, -1))
    return out_v, out_i
