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

from typing import NamedTuple

import numpy as np
import torch

from .graph_choice import KNN
from .knn_graph import merged_lists, stale_entries
from .plan import Plan
from .trees import Bucket, TreeBatch
from .vectors import compute_dtype, row_sims

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
    sims = merged_lists(bk, batch.vectors, r, np.asarray(row_np), keep, drop, E, rd, inv_t, batch.tree, batch.cap)
    stale, node_a, node_b = stale_entries(bk, rows_t, rd, merged, kept)
    where_p = None
    if sims is not None:
        where_p = torch.full((R, m), -1, dtype=torch.int64, device=dev)  # (R, m) slot -> its merged node's row of sims
        where_p[inv_t, keep] = torch.arange(r.shape[0], device=dev)
    return _KnnRound(bk, rows_t, stale, node_a, node_b, sims, where_p)


class _KnnRound(NamedTuple):
    """What :func:`_refresh` needs of one knn bucket's round. Shape: stale, node_a, node_b
    (R, m, k+1) for the touched rows ``rows``; sims (P, m): each merged node's cosines with
    its tree (or None), where_p (R, m): the row of sims of the merged node in each slot (-1)."""

    bk: Bucket
    rows: torch.Tensor
    stale: torch.Tensor
    node_a: torch.Tensor
    node_b: torch.Tensor
    sims: torch.Tensor | None
    where_p: torch.Tensor | None


def _refresh(batch: TreeBatch, parts: list[_KnnRound]) -> None:
    """New cosines for the stale entries of every knn bucket, found with one host read (two
    when some bucket's merged nodes were scored against their trees): an
    entry between a merged node and another slot of its tree reads its cosine from the
    merged node's products with its tree where the round computed them (``sims``), the
    others are computed from their vectors."""
    vec = batch.vectors
    dev = vec.device
    base, at, tables = 0, [], []
    for p in parts if any(p.sims is not None for p in parts) else ():
        R, m, c = p.stale.shape
        if p.sims is None:
            at.append(torch.full((R * m * c,), -1, dtype=torch.int64, device=dev))
            continue
        new = p.bk.nbr[p.rows]  # (R, m, k+1) targets after the round
        i = torch.arange(m, device=dev).expand(R, m)
        pa = p.where_p.gather(1, new.clamp(min=0).view(R, -1)).view(R, m, c)  # the target is a merged node
        pb = p.where_p[..., None].expand(R, m, c)  # the slot itself is one
        pos = torch.where(pa >= 0, pa * m + i[..., None], torch.where(pb >= 0, pb * m + new, -1))
        at.append(torch.where((new >= 0) & (pos >= 0), base + pos, -1).reshape(-1))
        tables.append(p.sims.reshape(-1))
        base += p.sims.numel()
    mask = torch.cat([p.stale.reshape(-1) for p in parts])
    buf = torch.cat([p.bk.cs[p.rows].reshape(-1) for p in parts])
    idx = torch.nonzero(mask).flatten()  # host read: how many entries changed
    left = idx
    if tables:
        pos = torch.cat(at)[idx]
        buf[idx] = torch.cat(tables)[pos.clamp(min=0)]
        left = idx[torch.nonzero(pos < 0).flatten()]  # host read: how many no product covers
    buf[left] = vec.dot_rows(torch.cat([p.node_a.reshape(-1) for p in parts])[left],
                             torch.cat([p.node_b.reshape(-1) for p in parts])[left])
    off = 0
    for p in parts:
        n = p.stale.numel()
        p.bk.cs[p.rows] = buf[off:off + n].view(p.stale.shape)
        off += n
