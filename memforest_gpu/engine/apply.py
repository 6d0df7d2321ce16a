"""Write one round's merges into the tree tensors (device only, no host read).

The merged node takes the lower slot of its pair and the other slot empties; its vector,
timestamp (the max), token count and span of positions are written, and its row/column of
the cosine matrix is recomputed against its tree. Every bucket is updated with one scatter
per tensor, whatever the number of pairs.
"""
from __future__ import annotations

import numpy as np
import torch

from .plan import Plan
from .trees import TreeBatch, compute_dtype, row_sims

__all__ = ["apply_round", "pair_means"]


def pair_means(batch: TreeBatch, plan: Plan) -> torch.Tensor:
    """Normalised mean of each planned pair's two vectors (when there is no embedder).

    Shape: -> (P, D)
    """
    D = batch.buckets[0].X.shape[2]
    parts = []
    for b, bk in enumerate(batch.buckets):
        lo, hi = plan.offsets[b], plan.offsets[b + 1]
        if lo < hi:
            r = plan.row[lo:hi]
            xa, xb = bk.X[r, plan.slot_a[lo:hi]], bk.X[r, plan.slot_b[lo:hi]]
            ct = compute_dtype(xa.dtype)  # half-precision storage: add in float32
            parts.append(xa.to(ct) + xb.to(ct))  # (P_b, D)
    if not parts:
        return torch.zeros(0, D)
    return torch.nn.functional.normalize(torch.cat(parts), dim=1)


def apply_round(batch: TreeBatch, plan: Plan, vectors: torch.Tensor, new_rows: np.ndarray,
                tokens: torch.Tensor | None = None) -> None:
    """Update ``batch`` in place with the round's merges.

    Shape: vectors (P, D) the merged nodes' vectors, new_rows (P,) host node rows of the
           merged nodes, tokens (P,) their token counts or None
    """
    for b, bk in enumerate(batch.buckets):
        lo, hi = int(plan.offsets[b]), int(plan.offsets[b + 1])
        if lo == hi:
            continue
        dev = bk.X.device
        r = plan.row[lo:hi]
        sa, sb = plan.slot_a[lo:hi], plan.slot_b[lo:hi]
        keep, drop = torch.minimum(sa, sb), torch.maximum(sa, sb)
        E = vectors[lo:hi].to(device=dev, dtype=bk.X.dtype)  # (P_b, D)
        ts = torch.maximum(bk.ts[r, keep], bk.ts[r, drop])
        first = torch.minimum(bk.lo[r, keep], bk.lo[r, drop])
        last = torch.maximum(bk.hi[r, keep], bk.hi[r, drop])
        bk.slot[r, keep] = torch.as_tensor(new_rows[lo:hi], dtype=torch.int64, device=dev)
        bk.slot[r, drop] = -1
        bk.X[r, keep] = E
        bk.X[r, drop] = 0
        sims = row_sims(bk.X, plan.row_np[lo:hi], E)  # (P_b, m), after all writes
        bk.W[r, keep, :] = sims
        bk.W[r, :, keep] = sims
        bk.ts[r, keep] = ts
        bk.lo[r, keep] = first
        bk.hi[r, keep] = last
        if bk.tok is not None and tokens is not None:
            bk.tok[r, keep] = tokens[lo:hi].to(device=dev, dtype=bk.tok.dtype)
