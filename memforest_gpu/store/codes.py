"""How a store file holds its vectors: float32, or int8 codes.

A vector is only ever used through its direction (cosines; every vector is normalised on
load), so a row of int8 codes needs no scale: ``int8`` stores each vector (text vectors and
keys alike) as ``round(127 * x / max|x|)``, the per-vector scale being implied by the
normalisation that every reader does anyway. Any Parquet tool keeps the codes (the column
type is int8), and a file of codes reads as the unit vectors they point along. Writing the
decoded vectors again gives the same codes (the largest code is always +-127).

``float32`` keeps the vectors as computed (the ``paper`` preset, and every store written
before int8 codes). docs/merged-keys.md measures what the codes cost in retention (nothing
beyond the noise) and save in bytes (a quarter of the vectors).
"""
from __future__ import annotations

import warnings

import numpy as np
import torch

from ..config import VECTOR_CODES

__all__ = ["VECTOR_CODES", "check_vector_codes", "int8_codes", "int8_codes_on"]



def check_vector_codes(value) -> None:
    """``value`` must be one of :data:`VECTOR_CODES`."""
    if value not in VECTOR_CODES:
        raise ValueError(f"vectors must be one of {list(VECTOR_CODES)}, got {value!r}")


def int8_codes(x: torch.Tensor | np.ndarray, *, block: int = 1 << 12) -> np.ndarray:
    """The int8 codes of each row: ``round(127 * x / max|x|)`` (a zero row: zeros), computed in
    float64 a block of rows at a time by :func:`int8_codes_on` on the host (at d = 384 a
    block's float64 temporary is 12.6 MB). Each row's codes depend on that row alone, so the
    block size never changes them.

    Shape: x (N, D) -> (N, D) int8 host
    """
    return int8_codes_on(_host_tensor(x), block=block).numpy()


def _host_tensor(x: torch.Tensor | np.ndarray) -> torch.Tensor:
    """``x`` as a host tensor, without a copy where it already is one (a read-only array, e.g. a
    view of an Arrow buffer, too: the codes only read it)."""
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu")
    a = np.ascontiguousarray(x)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(a)


def int8_codes_on(x: torch.Tensor, *, block: int = 1 << 12) -> torch.Tensor:
    """:func:`int8_codes` where ``x`` is (no host copy): the peak ``max|x|`` of each row, ``127 /
    peak`` in one division, one float64 product, rounding half to even (as ``np.rint``); torch's
    ops on the host run on every core.

    Shape: x (N, D) -> (N, D) int8 on x's device
    """
    out = torch.empty(x.shape, dtype=torch.int8, device=x.device)
    for lo in range(0, x.shape[0], block):
        v = x[lo:lo + block].double()
        peak = v.abs().amax(1, keepdim=True) if v.shape[1] else torch.zeros(v.shape[0], 1, dtype=v.dtype,
                                                                              device=v.device)
        # 127 / peak as one division, as NumPy's: torch's ``127.0 / t`` is ``t.reciprocal() * 127``,
        # two roundings, which moved a code by one where 127 x / peak lands on a half
        scale = torch.where(peak > 0, torch.full_like(peak, 127.0).div_(torch.where(peak > 0, peak, 1.0)), 0.0)
        out[lo:lo + block] = v.mul_(scale).round_().clamp_(-127, 127)
    return out
