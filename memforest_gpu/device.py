"""Resolve the compute device once, at the API boundary."""
from __future__ import annotations

import torch

__all__ = ["resolve_device"]

_VALID = ("auto", "cpu", "cuda")


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """``None``/``"auto"`` means CUDA when present, else CPU; ``"cuda:1"`` etc. pass through."""
    if isinstance(device, torch.device):
        return device
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = str(device)
    if name.split(":")[0] not in ("cpu", "cuda"):
        raise ValueError(f"device must be one of {list(_VALID)} (or 'cuda:N'), got {device!r}")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for but CUDA is not available on this machine")
    return torch.device(name)
