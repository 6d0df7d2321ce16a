"""Write one round's merges into the tree tensors (device only; one host read per round when
some bucket keeps the knn graph).

The merged node takes the lower slot of its pair and the other slot empties; its vector is
appended to the run's :class:`~.vectors.NodeVectors`, and its timestamp (the max), token
count and span of positions are written. Its row of the candidate graph is recomputed: in a
dense bucket, its row/column of the cosine matrix against its tree; in a knn bucket, its
list from its parents' lists and the entries that pointed at either parent
(:mod:`.knn_graph`). Every bucket is updated with one scatter per tensor, whatever the
number of pairs.
"""
from __future__ import annotations

import numpy as np
import torch

from .graph_choice import KNN
from .knn_graph import merged_lists, stale_entries
from .plan import Plan
from .trees import Bucket, TreeBatch, compute_dtype, row_sims

__all__ = ["apply_round", "pair_means"]


def pair_means(batch: TreeBatch, plan: Plan) -> torch.Tensor:
    """Normalised mean of each planned pair's two vectors (when there is no embedder).

    Shape: -> (P, D)
    """
    vec = batch.vectors
    if not len(plan):
        return torch.zeros(0, vec.dim)
    xa = vec.gather(torch.as_tensor(plan.node_a, dtype=torch.int64, device=vec.device))
    xb = vec.gather(torch.as_tensor(plan.node_b, dtype=torch.int64, device=vec.device))
    ct = compute_dtype(xa.dtype)  # half-precision storage: add in float32
    return torch.nn.functional.normalize(xa.to(ct) + xb.to(ct), dim=1)


def apply_round(batch: TreeBatch, plan: Plan, vectors: torch.Tensor, new_rows: np.ndarray,
                tokens: torch.Tensor | None = None) -> None:
    """Update ``batch`` in place with the round's merges.

    Shape: vectors (P, D) the merged nodes' vectors, new_rows (P,) host node rows of the
           merged nodes (the next rows of the run's node table), tokens (P,) their token counts
           or None
    """
    stored = batch.vectors.append(np.asarray(new_rows), vectors)  # (P, D) in the storage dtype
    stale = []
    for b, bk in enumerate(batch.buckets):
        lo, hi = int(plan.offsets[b]), int(plan.offsets[b + 1])
        if lo == hi:
            continue
        dev = bk.slot.device
        r = plan.row[lo:hi]
        sa, sb = plan.slot_a[lo:hi], plan.slot_b[lo:hi]
        keep, drop = torch.minimum(sa, sb), torch.maximum(sa, sb)
        E = stored[lo:hi].to(dev)  # (P_b, D)
        ts = torch.maximum(bk.ts[r, keep], bk.ts[r, drop])
        first = torch.minimum(bk.lo[r, keep], bk.lo[r, drop])
        last = torch.maximum(bk.hi[r, keep], bk.hi[r, drop])
        bk.slot[r, keep] = torch.as_tensor(new_rows[lo:hi], dtype=torch.int64, device=dev)
        bk.slot[r, drop] = -1
        bk.ts[r, keep] = ts
        bk.lo[r, keep] = first
        bk.hi[r, keep] = last
        if bk.tok is not None and tokens is not None:
            bk.tok[r, keep] = tokens[lo:hi].to(device=dev, dtype=bk.tok.dtype)
        if bk.graph == KNN:
            stale.append(_knn_round(batch, bk, plan.row_np[lo:hi], r, keep, drop, E))
        else:
            sims = row_sims(batch.vectors, bk.slot, plan.row_np[lo:hi], E)  # (P_b, m), after all writes
            bk.W[r, keep, :] = sims
            bk.W[r, :, keep] = sims
    if stale:
        _refresh(batch, stale)


def _knn_round(batch: TreeBatch, bk: Bucket, row_np: np.ndarray, r, keep, drop, E):
    """A knn bucket's merged lists and its stale entries (for :func:`_refresh`)."""
    dev = bk.slot.device
    rows, inv = np.unique(np.asarray(row_np, dtype=np.int64), return_inverse=True)  # touched rows
    rows_t = torch.as_tensor(rows, device=dev)
    inv_t = torch.as_tensor(inv.reshape(-1), dtype=torch.int64, device=dev)
    R, m = len(rows), bk.m
    rd = torch.arange(m, device=dev).repeat(R, 1)  # (R, m) slot -> slot after the round
    rd[inv_t, drop] = keep
    merged = torch.zeros(R, m, dtype=torch.bool, device=dev)
    merged[inv_t, keep] = True
    merged[inv_t, drop] = True
    kept = torch.zeros_like(merged)
    kept[inv_t, keep] = True
    merged_lists(bk, batch.vectors, r, keep, drop, E, rd, inv_t, batch.tree, batch.cap)
    stale, node_a, node_b = stale_entries(bk, rows_t, rd, merged, kept)
    return bk, rows_t, stale, node_a, node_b


def _refresh(batch: TreeBatch, parts, *, budget: int = 1 << 24) -> None:
    """New cosines for the stale entries of every knn bucket, found with one host read."""
    vec = batch.vectors
    mask = torch.cat([p[2].reshape(-1) for p in parts])
    node_a = torch.cat([p[3].reshape(-1) for p in parts])
    node_b = torch.cat([p[4].reshape(-1) for p in parts])
    buf = torch.cat([p[0].cs[p[1]].reshape(-1) for p in parts])
    idx = torch.nonzero(mask).flatten()  # host read: how many entries changed
    buf[idx] = vec.dot_rows(node_a[idx], node_b[idx], budget=budget)
    off = 0
    for bk, rows_t, stale, _, _ in parts:
        n = stale.numel()
        bk.cs[rows_t] = buf[off:off + n].view(stale.shape)
        off += n
