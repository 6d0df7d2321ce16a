"""What every best-match implementation keeps (:func:`~memforest_gpu.kernels.best_match`,
the PyTorch reference, and its Triton kernel): the modes, the tie rule and the input checks."""
from __future__ import annotations

import torch

__all__ = ["MODES", "TIE_EPS", "check_best_match_args"]

MODES = ("l2", "dot")
TIE_EPS = 1e-6  # scores this close to the best are ties (lowest index wins)


def check_best_match_args(X: torch.Tensor, C: torch.Tensor, mode: str) -> None:
    """Raise ``ValueError`` for an unknown ``mode`` or shapes that are not (T, n, D), (T, K, D)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
    if X.ndim != 3 or C.ndim != 3 or X.shape[0] != C.shape[0] or X.shape[2] != C.shape[2]:
        raise ValueError(f"X and C must be (T, n, D) and (T, K, D), got {tuple(X.shape)} and {tuple(C.shape)}")
