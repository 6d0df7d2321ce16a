"""Pack variable-size segments into a padded batch and back."""
from __future__ import annotations

import torch

__all__ = ["pack_segments", "unpack_segments"]


def pack_segments(seg: torch.Tensor, n_seg: int, order: torch.Tensor | None = None, *,
                  max_size: int | None = None):
    """Lay out items by segment: item ``i`` goes to row ``seg[i]``, column = its rank
    among its segment's items (in ``order`` when given, else in index order).
    ``max_size``: the largest segment's size when the caller knows it (saves a device read).

    Shape: seg (N,) int64 in [0, n_seg) -> index (S, n) int64 of item ids (-1 = padding),
    valid (S, n) bool, sizes (S,), with n = largest segment.
    """
    N = seg.shape[0]
    dev = seg.device
    if order is None:
        order = torch.arange(N, device=dev)
    s = seg[order]
    # stable sort by segment keeps `order` inside each segment
    s_sorted, perm = torch.sort(s, stable=True)
    items = order[perm]  # (N,)
    sizes = torch.bincount(seg, minlength=n_seg)  # (S,)
    starts = torch.cumsum(sizes, 0) - sizes  # (S,)
    col = torch.arange(N, device=dev) - starts[s_sorted]  # (N,)
    n = max_size if max_size is not None else (int(sizes.max()) if N else 0)
    index = torch.full((n_seg, max(n, 1)), -1, dtype=torch.int64, device=dev)
    index[s_sorted, col] = items
    return index, index >= 0, sizes


def unpack_segments(values: torch.Tensor, index: torch.Tensor, N: int, fill=0) -> torch.Tensor:
    """Inverse of :func:`pack_segments` for a per-slot value: (S, n, ...) -> (N, ...)."""
    out = torch.full((N,) + tuple(values.shape[2:]), fill, dtype=values.dtype, device=values.device)
    valid = index >= 0
    out[index[valid]] = values[valid]
    return out


def size_buckets(sizes: torch.Tensor, *, min_size: int = 1) -> list[torch.Tensor]:
    """Group segments into buckets of similar size (powers of two), so padding a bucket
    to its largest member wastes at most half. Segments smaller than ``min_size`` are
    left out. Returns segment ids per bucket, largest sizes first.

    Shape: sizes (S,) -> list of (S_b,) int64
    """
    s = sizes.detach().cpu()
    keep = s >= min_size
    if not bool(keep.any()):
        return []
    cls = torch.ceil(torch.log2(s.clamp(min=1).double())).long()
    out = []
    for c in torch.unique(cls[keep]).flip(0).tolist():
        ids = torch.nonzero(keep & (cls == c)).flatten()
        out.append(ids.to(sizes.device))
    return out
