"""Write one round's merges into the tree tensors (device only; one host read per round when
some bucket keeps the knn graph).

The merged node takes the lower slot of its pair and the other slot empties; its vector is
appended to the run's :class:`~.node_vectors.NodeVectors`, and its timestamp (the max), token
count and span of positions are written. Its row of the candidate graph is recomputed: in a
dense bucket, its row/column of the cosine matrix against its tree; in a knn bucket, its
list from its parents' lists and the entries that pointed at either parent
(:mod:`.trees`). Every bucket is updated with one scatter per tensor, whatever the
number of pairs.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from ..kernels.blocks import for_device, row_blocks, stream_rows
from .knn_graph import RoundPairs, SlotMoves, merged_lists, stale_entries, tree_products_pay
from .node_vectors import compute_dtype, row_sims
from .plan import Plan
from .trees import KNN, Bucket, BucketLayout

__all__ = ["apply_round", "pair_means"]


def pair_means(batch: BucketLayout, plan: Plan, *, put: tuple[np.ndarray, np.ndarray] | None = None
               ) -> torch.Tensor | None:
    """Normalised mean of each planned pair's two vectors (when there is no embedder). Where
    the run's vectors are stored in their compute dtype, the means are written straight into
    the vector table's next rows (:meth:`~.node_vectors.NodeVectors.next_rows`), which
    :func:`apply_round` then takes without a copy: no (P, D) block of the round besides. A table
    that reuses its rows (:meth:`~.node_vectors.NodeVectors.put`) takes each block as it is made
    (``put``: the merged nodes' rows and their storage rows) and ``None`` is returned.

    Shape: -> (P, D) or None
    """
    vec = batch.vectors
    if not len(plan):
        return torch.zeros(0, vec.dim)
    a = torch.as_tensor(plan.node_a, dtype=torch.int64, device=vec.device)
    b = torch.as_tensor(plan.node_b, dtype=torch.int64, device=vec.device)
    ct = compute_dtype(vec.dtype)  # half-precision storage: add in float32
    if put is not None:  # each block into the rows of its pairs' parents (a pair's rows are its own)
        for blk in row_blocks(len(a), stream_rows(vec.device, vec.dim * 4 * 6)):
            vec.put(put[0][blk], put[1][blk],
                    torch.nn.functional.normalize(vec.gather(a[blk]).to(ct) + vec.gather(b[blk]).to(ct), dim=1))
        return None
    out = vec.next_rows(len(a)) if ct == vec.dtype else torch.empty(len(a), vec.dim, dtype=ct, device=vec.device)
    # a block of pairs at a time: the gathers and sums of a whole round (250,000 pairs at 1M
    # nodes) would hold six (P, D) temporaries at once; each row's result is the same either way
    for blk in row_blocks(len(a), stream_rows(vec.device, vec.dim * 4 * 6)):
        out[blk] = torch.nn.functional.normalize(vec.gather(a[blk]).to(ct) + vec.gather(b[blk]).to(ct), dim=1)
    return out


def apply_round(batch: BucketLayout, plan: Plan, vectors: torch.Tensor | None, new_rows: np.ndarray,
                tokens: torch.Tensor | None = None, at: np.ndarray | None = None) -> None:
    """Update ``batch`` in place with the round's merges.

    Shape: vectors (P, D) the merged nodes' vectors (``None``: already put into a table that
           reuses its rows, at ``at``), new_rows (P,) host node rows of the merged nodes (the
           next rows of the run's node table), tokens (P,) their token counts or None, at (P,)
           host storage rows (a table that reuses its rows)
    """
    vec = batch.vectors
    if not vec.reuse:
        vec.append(np.asarray(new_rows), vectors)
    elif vectors is not None:
        vec.put(new_rows, at, vectors)
    stale = []
    for b, bk in enumerate(batch.buckets):
        p0, p1 = int(plan.offsets[b]), int(plan.offsets[b + 1])  # the bucket's pairs in the plan
        if p0 == p1:
            continue
        dev = bk.slot.device
        r = plan.row[p0:p1]
        sa, sb = plan.slot_a[p0:p1], plan.slot_b[p0:p1]
        keep, drop = torch.minimum(sa, sb), torch.maximum(sa, sb)
        # the merged nodes' rows: their vectors (in the table now) are read a group of pairs at
        # a time below, never as one (P_b, D) block of the bucket (1M nodes: 300 MB)
        nodes = torch.as_tensor(np.asarray(new_rows[p0:p1]), dtype=torch.int64, device=dev)  # (P_b,)
        ts = torch.maximum(bk.ts[r, keep], bk.ts[r, drop])
        first = torch.minimum(bk.lo[r, keep], bk.lo[r, drop])  # span of positions (Bucket.lo / hi)
        last = torch.maximum(bk.hi[r, keep], bk.hi[r, drop])
        bk.slot[r, keep] = nodes
        bk.slot[r, drop] = -1
        bk.ts[r, keep] = ts
        bk.lo[r, keep] = first
        bk.hi[r, keep] = last
        if bk.tok is not None and tokens is not None:
            bk.tok[r, keep] = tokens[p0:p1].to(device=dev, dtype=bk.tok.dtype)
        if bk.graph == KNN:
            stale.extend(_knn_round(batch, bk, RoundPairs(r, np.asarray(plan.row_np[p0:p1], dtype=np.int64),
                                                          keep, drop, nodes)))
        else:
            sims = row_sims(batch.vectors, bk.slot, plan.row_np[p0:p1], nodes, sizes=bk.sizes)  # (P_b, m), after writes
            bk.W[r, keep, :] = sims
            bk.W[r, :, keep] = sims
    if stale:
        _refresh(batch, stale)


#: bytes of the merged nodes' products with their trees a knn bucket holds at once in a round
#: (:func:`_knn_round` takes its touched trees in groups that fit): the products of a matching
#: round at 1M nodes are several GB
ROUND_BLOCK_BYTES = {"cpu": 64 << 20, "cuda": 2 << 30}


def _knn_round(batch: BucketLayout, bk: Bucket, pairs: RoundPairs) -> list[_KnnRound]:
    """A knn bucket's merged lists, and its stale entries for :func:`_refresh`.

    The touched trees are taken in groups whose merged nodes' products with their trees
    (:func:`~.trees.merged_lists`) fit :data:`ROUND_BLOCK_BYTES`; each group fills the
    stale entries those products cover at once and leaves the others to :func:`_refresh`.
    Every tree's result is the same whatever the grouping.
    """
    dev = bk.slot.device
    m, c = bk.m, batch.spanning.knn + 1
    products = tree_products_pay(pairs.row_np, m, 2 * c)  # decided once for the bucket's round
    rows, touched = np.unique(pairs.row_np, return_inverse=True)  # touched rows; each pair's among them
    touched = touched.reshape(-1)
    counts = np.bincount(touched, minlength=len(rows))  # pairs per touched row
    most = int(counts.max())  # the most pairs of one tree in the round
    per_row = m * c * 32 + (counts * m * 4 if products else 0)  # bytes a touched row holds for a while
    groups = _groups(np.broadcast_to(per_row, counts.shape), for_device(ROUND_BLOCK_BYTES, dev))
    order = np.argsort(touched, kind="stable") if len(groups) > 1 else None  # pairs grouped by row
    start = np.cumsum(counts) - counts
    parts = []
    for g0, g1 in groups:  # touched rows [g0, g1)
        if order is None:
            group = pairs._replace(touched=torch.as_tensor(touched, dtype=torch.int64, device=dev))
        else:
            sel = order[start[g0]:start[g1 - 1] + counts[g1 - 1]]
            group = pairs.take(sel, touched[sel] - g0)
        moves = SlotMoves.of(torch.as_tensor(rows[g0:g1], device=dev), group, m)
        sims = merged_lists(bk, batch.vectors, group, moves, batch.spanning, batch.cap, products=products, most=most)
        stale = stale_entries(bk, moves)
        if sims is not None:
            stale = _fill_from_products(bk, moves.rows, stale, sims, group)
        parts.append(_KnnRound(bk, moves.rows, stale))
    return parts


def _groups(cost: np.ndarray, limit: int) -> list[tuple[int, int]]:
    """Consecutive groups ``[lo, hi)`` of rows whose summed ``cost`` stays within ``limit``
    (a row over it alone is a group). Shape: cost (R,) host"""
    R = len(cost)
    if R == 0 or int(cost.sum()) <= limit:
        return [(0, R)] if R else []
    out, lo, acc = [], 0, 0
    for i, x in enumerate(cost.tolist()):
        if i > lo and acc + x > limit:
            out.append((lo, i))
            lo, acc = i, 0
        acc += x
    out.append((lo, R))
    return out


def _fill_from_products(bk: Bucket, rows: torch.Tensor, stale: torch.Tensor, sims: torch.Tensor,
                        pairs: RoundPairs) -> torch.Tensor:
    """Write the new cosines of the stale entries that the merged nodes' products with their
    trees cover (an entry from or to a merged node), and return the entries still stale.

    Shape: rows (R,), stale (R, m, k+1), sims (P, m) -> (R, m, k+1) bool
    """
    inv, keep = pairs.touched, pairs.keep
    R, m, c = stale.shape
    dev = rows.device
    where_p = torch.full((R, m), -1, dtype=torch.int64, device=dev)  # slot -> its merged node's row of sims
    where_p[inv, keep] = torch.arange(keep.shape[0], device=dev)
    new = bk.nbr[rows].long()  # (R, m, k+1) targets after the round
    i = torch.arange(m, device=dev).expand(R, m)
    pa = where_p.gather(1, new.clamp(min=0).view(R, -1)).view(R, m, c)  # the target is a merged node
    pb = where_p[..., None].expand(R, m, c)  # the slot itself is one
    pos = torch.where(pa >= 0, pa * m + i[..., None], torch.where(pb >= 0, pb * m + new, -1))
    fill = stale & (new >= 0) & (pos >= 0)
    bk.cs[rows] = torch.where(fill, sims.view(-1)[pos.clamp(min=0)].to(bk.cs.dtype), bk.cs[rows])
    return stale & ~fill


class _KnnRound(NamedTuple):
    """What :func:`_refresh` needs of a group of a knn bucket's touched rows ``rows``.
    Shape: stale (R, m, k+1): the entries still without a cosine."""

    bk: Bucket
    rows: torch.Tensor
    stale: torch.Tensor


def _refresh(batch: BucketLayout, parts: list[_KnnRound]) -> None:
    """New cosines for the stale entries of every knn bucket that no merged node's products
    covered, computed from their vectors after one host read (how many there are in each
    group). The node rows of an entry's two ends are looked up for the stale entries only:
    the slot of the entry's row, and the slot its (updated) list entry points at."""
    counts = torch.stack([p.stale.sum() for p in parts]).tolist()  # host read: how many entries changed
    for p, n in zip(parts, counts):
        if not n:
            continue
        R, m, c = p.stale.shape
        idx = torch.nonzero_static(p.stale.reshape(-1), size=n).flatten()  # (n,), no read: n is known
        rows, i, j = p.rows[idx // (m * c)], idx // c % m, idx % c
        a = p.bk.slot[rows, i]
        b = p.bk.slot[rows, p.bk.nbr[rows, i, j].long()]
        p.bk.cs[rows, i, j] = batch.vectors.dot_rows(a, b).to(p.bk.cs.dtype)
