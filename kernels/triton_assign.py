"""Fused best-match in Triton: similarity + running argmax without writing the (n, K) scores.

Same contract as :func:`memforest_gpu.kernels.best_match` (its PyTorch reference and
fallback): for every point of every problem, the best valid centre, ties (scores within
``TIE_EPS``) to the lowest centre index. The kernel resolves ties per centre tile as it
walks them, so it can differ from the reference only for a chain of distinct scores
spread wider than ``TIE_EPS`` around the best, never for duplicate centres. One program
handles BLOCK_N points of one problem and walks all centres in BLOCK_K tiles, keeping the
best score and index in registers.

Runs on CUDA, or anywhere under the Triton interpreter (``TRITON_INTERPRET=1``), which
is how CI checks it on a CPU.

Choices that depend on Triton's documented behaviour:

- ``triton`` and ``triton.language`` are imported at module level and the kernel is a
  module-level function: ``@triton.jit`` resolves the names a kernel uses from its
  function's globals; looking names up in ``fn.__closure__`` came only with
  triton-lang/triton#7105 (June 2025), so on older Triton a kernel defined inside a
  function that imported ``tl`` locally fails to build.
- Pointer offsets are computed in int64: Triton types integer scalars and ``tl.arange`` as
  int32 and keeps ``int32 * int32`` in int32, so ``row * stride`` wraps once ``n x D``
  passes 2**31 (triton-lang/triton#6748: pointers do not widen offsets; the usual fix is
  casting the program id to int64 before multiplying by a stride, as done here).
- ``triton.jit`` picks the interpreter or the compiler when it decorates
  (``knobs.runtime.interpret``, from ``TRITON_INTERPRET``), so the decoration is done
  on first use, once per mode.

When ``backend="auto"`` runs on CUDA and the kernel cannot be used, :func:`try_best_match_triton`
records why (:func:`fallback_reasons`) and logs it once per reason; the PyTorch path
then runs. Nothing is switched off silently.
"""
from __future__ import annotations

import logging
import os
import threading
from collections import Counter

import torch

from .best_match_rule import TIE_EPS, check_best_match_args

try:
    import triton
    import triton.language as tl
except ImportError:  # the PyTorch path is used; fallback_reasons() says so on CUDA
    triton = tl = None

__all__ = ["unavailable_reason", "best_match_triton", "try_best_match_triton",
           "fallback_reasons", "reset_fallbacks"]

log = logging.getLogger("memforest_gpu")


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def unavailable_reason(device: torch.device | str) -> str | None:
    """Why the Triton kernel cannot run on ``device``, or ``None`` when it can (CUDA, or
    the interpreter switched on, and ``MEMFOREST_TRITON`` not ``0``)."""
    if triton is None:
        return "triton is not installed (pip install 'memforest-gpu[triton]')"
    if os.environ.get("MEMFOREST_TRITON") == "0":
        return "MEMFOREST_TRITON=0"
    dev = torch.device(device)
    if dev.type != "cuda" and not _interpret():
        return f"device {dev.type!r} is not CUDA and TRITON_INTERPRET is not 1"
    return None


if tl is not None:
    def _best_match_kernel(X, C, BIAS, OUT_V, OUT_I, n, K, D, scale, tie_eps,
                           sxt, sxn, sct, sck, sbt, sot,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
        # int64 from here on: rows * sxn passes 2**31 when n x D does
        t = tl.program_id(0).to(tl.int64)
        pid = tl.program_id(1).to(tl.int64)
        rows = pid * BLOCK_N + tl.arange(0, BLOCK_N).to(tl.int64)  # (BLOCK_N,)
        rmask = rows < n
        x_base = X + t * sxt + rows[:, None] * sxn  # (BLOCK_N, 1) pointers
        best_v = tl.full((BLOCK_N,), float("-inf"), tl.float32)
        best_i = tl.full((BLOCK_N,), -1, tl.int64)
        for k0 in range(0, K, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K).to(tl.int64)  # (BLOCK_K,)
            cmask = cols < K
            c_base = C + t * sct + cols[:, None] * sck  # (BLOCK_K, 1) pointers
            acc = tl.zeros((BLOCK_N, BLOCK_K), tl.float32)
            for d0 in range(0, D, BLOCK_D):
                ds = d0 + tl.arange(0, BLOCK_D)
                dmask = ds < D
                x = tl.load(x_base + ds[None, :], mask=rmask[:, None] & dmask[None, :], other=0.0)  # (BLOCK_N, BLOCK_D)
                c = tl.load(c_base + ds[None, :], mask=cmask[:, None] & dmask[None, :], other=0.0)  # (BLOCK_K, BLOCK_D)
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


_JITTED: dict[bool, object] = {}  # interpreter on/off -> decorated kernel


def _kernel():
    mode = _interpret()
    if mode not in _JITTED:
        _JITTED[mode] = triton.jit(_best_match_kernel)
    return _JITTED[mode]


def best_match_triton(X: torch.Tensor, C: torch.Tensor, c_valid: torch.Tensor, *, mode: str = "l2",
                      block_n: int = 64, block_k: int = 64, block_d: int = 32):
    """Triton version of :func:`best_match` (same arguments, same results).

    Shape: X (T, n, D), C (T, K, D), c_valid (T, K) -> score (T, n), index (T, n) int64
    """
    if triton is None:
        raise ImportError("the Triton best-match kernel needs triton: pip install 'memforest-gpu[triton]'")
    check_best_match_args(X, C, mode)
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
    _kernel()[grid](Xc, Cc, bias, out_v, out_i, n, K, D, 2.0 if mode == "l2" else 1.0, TIE_EPS,
                    Xc.stride(0), Xc.stride(1), Cc.stride(0), Cc.stride(1), bias.stride(0), out_v.stride(0),
                    BLOCK_N=block_n, BLOCK_K=block_k, BLOCK_D=block_d)
    out_i = torch.where(torch.isfinite(out_v), out_i, torch.full_like(out_i, -1))
    return out_v, out_i


# --------------------------------------------------------------------------- fallback record
_lock = threading.Lock()
_FALLBACKS: Counter = Counter()  # reason -> PyTorch runs instead of the kernel
_BROKEN: dict[tuple[str, str], str] = {}  # (device, mode) -> why the kernel failed there


def _record(reason: str) -> None:
    with _lock:
        first = reason not in _FALLBACKS
        _FALLBACKS[reason] += 1
    if first:
        log.warning("Triton best_match not used, PyTorch path instead: %s", reason)


def fallback_reasons() -> dict[str, int]:
    """How often ``backend="auto"`` on CUDA ran the PyTorch path instead of the kernel, by
    reason."""
    with _lock:
        return dict(_FALLBACKS)


def reset_fallbacks() -> None:
    """Forget the recorded fallbacks and kernel failures (the next call tries the kernel again)."""
    with _lock:
        _FALLBACKS.clear()
        _BROKEN.clear()


def _kernel_expected(X: torch.Tensor) -> bool:
    """``backend="auto"`` means the kernel for these inputs (CUDA tensors)."""
    return X.is_cuda


def try_best_match_triton(X: torch.Tensor, C: torch.Tensor, c_valid: torch.Tensor, *, mode: str, backend: str):
    """The kernel's result, or ``None`` where the PyTorch path should run.

    ``backend="triton"``: always the kernel (its errors propagate). ``backend="auto"``: the
    kernel for CUDA tensors; when it cannot run or fails, the reason is recorded (see
    :func:`fallback_reasons`) and ``None`` returned. A kernel that failed on a device and
    mode is not retried there until :func:`reset_fallbacks`; each skipped call is counted
    under the same reason. CPU tensors return ``None`` without a record: the PyTorch path
    is the CPU path, not a fallback.
    """
    if backend == "triton":
        return best_match_triton(X, C, c_valid, mode=mode)
    if not _kernel_expected(X):
        return None
    key = (str(X.device), mode)
    reason = unavailable_reason(X.device) or _BROKEN.get(key)
    if reason is None:
        try:
            return best_match_triton(X, C, c_valid, mode=mode)
        except Exception as e:  # noqa: BLE001 - a kernel that fails to build must not stop the run
            reason = f"kernel failed on {key[0]} ({mode}): {type(e).__name__}: {e}"
            with _lock:
                _BROKEN[key] = reason
    _record(reason)
    return None
