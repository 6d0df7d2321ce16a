"""The knn candidate graph of big trees (:mod:`.trees` says which buckets keep it).

Each slot keeps the ``k = knn`` neighbours with the best edge weights
(:func:`~.edges.edge_weight`) and, in a last column, its next live slot in time, each with
its cosine. The spanning forest is built on the union of these lists (an edge listed by
either end), and the time column chains every live slot of a tree, so the forest always
spans the tree (under a strict node cap a pair over it is no edge; :mod:`.plan` then
joins the pieces the cap leaves).

Building (:func:`build_knn_graph`), per chunk of trees: the kernels of
:mod:`~memforest_gpu.kernels.knn` find ``k + k//2`` candidates per slot by
``(1 - time_weight) * cos - size_weight * tok_j / size_unit`` (the part of the weight that a
matrix multiply can carry; exact blockwise, or in cells for trees of more than
``knn_cells_above`` nodes), then the candidates' cosines are recomputed in float64 and the
``k`` best by exact weight kept (ties: lower slot).

After a round (:func:`merged_lists`, :func:`stale_entries`): a merged node's list is re-ranked
from the union of its two parents' lists; an entry of another slot that pointed at either
parent now points at the merged node (its cosine recomputed), the time column follows the
live slots, and the dropped slot's list is cleared. Nothing here reads the device.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from ..config import SpanningConfig
from ..kernels.blocks import stream_rows
from ..kernels.knn import knn_cells, top_by_key
from .edges import Ends, edge_weight, ends_of
from .node_vectors import NodeVectors, compute_dtype, dot64, dot64_many, row_sims

__all__ = ["build_knn_graph", "next_live", "merged_lists", "stale_entries", "tree_products_pay", "SLOT_DTYPE",
           "RoundPairs", "SlotMoves"]


#: the graph's stored slot indices: a tree's slots fit in 32 bits (a half of the int64 table); every
#: read widens them to int64 first, so the arithmetic on them is the same as on int64 storage
SLOT_DTYPE = torch.int32


def _ends_at(bk, rows: torch.Tensor, slots: torch.Tensor) -> Ends:
    """Attributes of slots ``slots`` of rows ``rows`` (broadcast together), read in place."""
    return ends_of(bk.lo[rows, slots], bk.hi[rows, slots], None if bk.tok is None else bk.tok[rows, slots],
                   bk.ts[rows, slots])


def next_live(slot: torch.Tensor) -> torch.Tensor:
    """Each slot's next live slot (slots are in time order), -1 for the last.
    Shape: slot (B, m) -> (B, m) int64"""
    B, m = slot.shape
    idx = torch.arange(m, device=slot.device).expand(B, m)
    at = torch.where(slot >= 0, idx, torch.full_like(idx, m))
    nxt = torch.flip(torch.cummin(torch.flip(at, [1]), 1).values, [1])  # first live slot >= s
    nxt = torch.cat([nxt[:, 1:], torch.full((B, 1), m, dtype=nxt.dtype, device=nxt.device)], 1)
    return torch.where(nxt < m, nxt, torch.full_like(nxt, -1))


def build_knn_graph(bk, vectors: NodeVectors, spanning: SpanningConfig, cap: int | None, *,
                    tile_elements: int = 1 << 24):
    """The knn graph of a bucket's trees (module docstring).

    With the trees' sizes (``bk.sizes``: each tree's live slots are a prefix of its row), the
    exact lists take trees in order of size, a chunk at a time, each chunk cut to its largest
    tree's slots: a bucket pads trees to a power of two, so without the cut about half of the
    products would be of padding. The lists are the same (a padded slot has none).

    Shape: bk.slot (B, m) -> nbr (B, m, k+1) int32 slot (-1 = none), cs (B, m, k+1) cosines
    """
    B, m = bk.slot.shape
    k, D = spanning.knn, vectors.dim
    dev = bk.slot.device
    nbr = torch.full((B, m, k + 1), -1, dtype=SLOT_DTYPE, device=dev)
    cs = torch.zeros(B, m, k + 1, dtype=compute_dtype(vectors.dtype), device=dev)
    c = min(m - 1, k + k // 2)  # candidates re-ranked by exact weight
    cells = m > spanning.knn_cells_above
    nbr[:, :, k] = next_live(bk.slot)
    # trees whose vectors are gathered at once: a cache-sized float64 copy where the exact
    # products are taken in blocks, a bounded one for the cells' search
    step = max(1, tile_elements // max(1, m * (D + 1))) if cells else max(1, stream_rows(dev, m * D * 8) // 4)
    sizes = None if cells else bk.sizes  # the cells' search takes its trees whole
    order = np.arange(B) if sizes is None else np.argsort(sizes, kind="stable")
    for b0 in range(0, B, step):
        ids = order[b0:b0 + step]
        rows = torch.as_tensor(ids, dtype=torch.int64, device=dev)
        # the chunk's slots: up to its largest tree (at least c + 1, so every list has its c candidates)
        mc = m if sizes is None else min(m, max(int(sizes[ids].max()), c + 1))
        slots = bk.slot[rows, :mc]
        X = vectors.gather(slots)  # (Bc, mc, D)
        e = bk.ends(rows).map(lambda x: x[:, :mc])
        nxt = nbr[rows, :mc, k].long()  # (Bc, mc)
        if not cells:
            near, near_cs, next_cs = _exact_lists(X, slots >= 0, e, nxt, c, k, spanning, cap, vectors.dtype)
            nbr[rows, :mc, :k], cs[rows, :mc, :k], cs[rows, :mc, k] = near.to(SLOT_DTYPE), near_cs, next_cs
            continue
        cand = knn_cells(X, slots >= 0, c, scale=1.0 - spanning.time_weight, bias=_bias(e, spanning),
                         tile_elements=tile_elements)
        near, near_cs = _rank(X, e, cand, k, spanning, cap, vectors.dtype, tile_elements)
        nbr[rows, :, :k], cs[rows, :, :k] = near.to(SLOT_DTYPE), near_cs
        cs[rows, :, k] = dot64(X, X.gather(1, nxt.clamp(min=0)[..., None].expand_as(X)), vectors.dtype)
    return nbr, cs


def _bias(e: Ends, spanning: SpanningConfig) -> torch.Tensor | None:
    """The size term's part of a pair's weight that depends on the neighbour only:
    ``-size_weight * tok_j / size_unit`` (None without the size term). Shape: -> (B, m) float32"""
    if spanning.size_weight > 0 and e.tok is not None:
        return -spanning.size_weight * e.tok.float() / float(spanning.size_unit)
    return None


# On a CPU, the bytes of one block of :func:`_exact_lists`'s products and their two (B, r, m)
# companions: four cache-sized blocks, where the float64 products of trees of 1,000-4,000 nodes run
# about twice as fast as in one (a block's rows never change a result).
_EXACT_BLOCK_BYTES = 8 << 20


def _exact_lists(X: torch.Tensor, valid: torch.Tensor, e: Ends, nxt: torch.Tensor, c: int, k: int,
                 spanning: SpanningConfig, cap, dtype):
    """Every slot's ``k`` best neighbours by exact edge weight, from one float64 product of
    each row block against its whole tree: the ``c`` best by the part of the weight the
    product carries (``(1 - time_weight) * cos + bias_j``) are re-ranked by the exact weight
    (ties: the lower slot), and every cosine (the neighbours', the next slot's) is
    read from the same product, rounded to the similarities' dtype as :func:`dot64` does.

    Shape: X (B, m, D), valid, nxt (B, m) -> nbr (B, m, k), cs (B, m, k), next cosine (B, m)
    """
    B, m, _ = X.shape
    dev = X.device
    nbr = torch.full((B, m, k), -1, dtype=torch.int64, device=dev)
    cs = torch.zeros(B, m, k, dtype=compute_dtype(dtype), device=dev)
    cs_next = torch.zeros(B, m, dtype=cs.dtype, device=dev)
    Xd = X.double()  # (B, m, D)
    Xt = Xd.transpose(1, 2)
    bias = _bias(e, spanning)
    scale = 1.0 - spanning.time_weight
    # what the proxy adds per column: the bias, -inf where no slot is (a slot's own column too, below)
    add = (bias if bias is not None else torch.zeros(B, m, dtype=cs.dtype, device=dev)).masked_fill(~valid, -math.inf)
    rows = max(2, _EXACT_BLOCK_BYTES // (B * m * 8 * 3) if dev.type != "cuda" else stream_rows(dev, B * m * 8))
    for r0 in range(0, m, rows):
        r1 = min(m, r0 + rows)
        cos = torch.bmm(Xd[:, r0:r1], Xt).to(cs.dtype)  # (B, r, m): float64 products, rounded once
        proxy = cos * scale
        proxy += add[:, None, :]
        proxy.diagonal(offset=r0, dim1=1, dim2=2).fill_(-math.inf)  # no pair with itself
        pv, cand = torch.topk(proxy, c, dim=-1)  # (B, r, c) a superset
        cand = torch.where(torch.isneginf(pv), torch.full_like(cand, -1), cand)
        cc = cos.gather(-1, cand.clamp(min=0))
        w, _ = edge_weight(cc, e.at(np.s_[:, r0:r1, None]), e.in_rows(cand), spanning, cap)
        top, _, j = top_by_key(w.masked_fill(cand < 0, float("-inf")), cand, k)
        live = valid[:, r0:r1, None]
        nbr[:, r0:r1] = torch.where(live, top, torch.full_like(top, -1))
        cs[:, r0:r1] = cc.gather(-1, j)
        cs_next[:, r0:r1] = cos.gather(-1, nxt[:, r0:r1, None].clamp(min=0))[..., 0]
    return nbr, cs, cs_next


def _rank(X: torch.Tensor, e: Ends, cand: torch.Tensor, k: int, spanning: SpanningConfig, cap, dtype,
          tile_elements: int):
    """The ``k`` best candidates of each slot by exact edge weight, with their cosines.
    Shape: X (B, m, D), cand (B, m, c) -> nbr (B, m, k), cs (B, m, k)"""
    B, m, c = cand.shape
    D = X.shape[2]
    nbr = torch.full((B, m, k), -1, dtype=torch.int64, device=X.device)
    cs = torch.zeros(B, m, k, dtype=compute_dtype(dtype), device=X.device)
    rows = max(1, tile_elements // max(1, B * c * D))
    bi = torch.arange(B, device=X.device)[:, None, None]
    Xd = X.double()  # gathered once in float64: the products below are accumulated in float64
    for r0 in range(0, m, rows):
        cd = cand[:, r0:r0 + rows]  # (B, r, c)
        cos = dot64_many(Xd[:, r0:r0 + rows], Xd[bi, cd.clamp(min=0)], dtype)  # (B, r, c)
        me = e.at(np.s_[:, r0:r0 + rows, None])  # (B, r, 1)
        w, _ = edge_weight(cos, me, e.in_rows(cd), spanning, cap)
        w = w.masked_fill(cd < 0, float("-inf"))
        top, _, j = top_by_key(w, cd, k)
        nbr[:, r0:r0 + rows] = top
        cs[:, r0:r0 + rows] = cos.gather(-1, j)
    return nbr, cs


class RoundPairs(NamedTuple):
    """One knn bucket's merges in a round (or those of a group of its touched trees): the apply
    side's counterpart of :class:`~.plan.Plan`.

    Shape: row (P,) each pair's tree row in the bucket, row_np (P,) its host copy, keep / drop
           (P,) the pair's lower / higher slot (the merged node takes ``keep``, ``drop``
           empties), nodes (P,) the merged nodes' rows (their vectors are read from the run's
           table a group at a time), touched (P,)
           each pair's index among the rows of its :class:`SlotMoves` (None until known)
    """

    row: torch.Tensor
    row_np: np.ndarray
    keep: torch.Tensor
    drop: torch.Tensor
    nodes: torch.Tensor
    touched: torch.Tensor | None = None

    def take(self, sel: np.ndarray, touched: np.ndarray) -> RoundPairs:
        """The pairs ``sel`` (host indices), with their index among the group's touched rows."""
        t = torch.as_tensor(sel, dtype=torch.int64, device=self.row.device)
        return RoundPairs(self.row[t], self.row_np[sel], self.keep[t], self.drop[t], self.nodes[t],
                          torch.as_tensor(touched, dtype=torch.int64, device=self.row.device))


class SlotMoves(NamedTuple):
    """Where the slots of a round's touched tree rows go.

    Shape: rows (R,) the touched tree rows, after (R, m) each slot's slot after the round (a
           dropped slot -> the slot it merged into), merged (R, m) bool the slots of this
           round's pairs, kept (R, m) bool the slots the merged nodes took
    """

    rows: torch.Tensor
    after: torch.Tensor
    merged: torch.Tensor
    kept: torch.Tensor

    @classmethod
    def of(cls, rows: torch.Tensor, pairs: RoundPairs, m: int) -> SlotMoves:
        """The moves of ``pairs`` (whose ``touched`` index ``rows``)."""
        R, dev, t = rows.shape[0], rows.device, pairs.touched
        after = torch.arange(m, device=dev).repeat(R, 1)
        after[t, pairs.drop] = pairs.keep
        merged = torch.zeros(R, m, dtype=torch.bool, device=dev)
        merged[t, pairs.keep] = True
        merged[t, pairs.drop] = True
        kept = torch.zeros_like(merged)
        kept[t, pairs.keep] = True
        return cls(rows, after, merged, kept)


def merged_lists(bk, vectors: NodeVectors, pairs: RoundPairs, moves: SlotMoves, spanning: SpanningConfig,
                 cap: int | None, *, products: bool, most: int | None = None) -> torch.Tensor | None:
    """Re-rank each merged slot's list from its two parents' lists; clear the dropped slot's.
    Call after the round's slot, span, time and token writes and after ``vectors.append``.

    The candidates' cosines come from one of two computations of the same float64 products,
    chosen by the caller from the round's shape (host-known, so the choice reads nothing
    from the device): where a tree merges many pairs in the round (``products``,
    :func:`tree_products_pay`), each merged
    node against every slot of its tree (:func:`~.trees.row_sims`: one gather of the tree
    per round), returned so that the stale entries pointing at a merged node read their
    cosines from it; else each merged node against its candidates only (None is returned).

    Shape: pairs (P,) each field, moves over the pairs' touched rows, most: the most pairs of a
           tree in the round (default: counted in ``pairs.row_np``) -> (P, m) cosines or None
    """
    r, keep, drop, nodes = pairs.row, pairs.keep, pairs.drop, pairs.nodes
    k = spanning.knn
    P = r.shape[0]
    cand = torch.cat([bk.nbr[r, keep], bk.nbr[r, drop]], 1).long()  # (P, 2k+2)
    cand = torch.where(cand >= 0, moves.after[pairs.touched[:, None], cand.clamp(min=0)], cand)
    cand = torch.where(cand == keep[:, None], torch.full_like(cand, -1), cand)
    cand = torch.sort(cand, dim=1).values
    dup = torch.cat([torch.zeros_like(cand[:, :1], dtype=torch.bool), cand[:, 1:] == cand[:, :-1]], 1)
    cand = torch.where(dup, torch.full_like(cand, -1), cand)  # each neighbour once
    me = _ends_at(bk, r[:, None], keep[:, None])  # (P, 1)
    sims = None
    if products:
        sims = row_sims(vectors, bk.slot, pairs.row_np, nodes, pmax=most, sizes=bk.sizes)  # (P, m)
        cos = sims.gather(1, cand.clamp(min=0))
    else:
        cos = torch.zeros(cand.shape, dtype=bk.cs.dtype, device=cand.device)  # (P, c)
        step = stream_rows(r.device, cand.shape[1] * vectors.dim * 12)  # pairs whose vectors fit in the cache
        for p0 in range(0, P, step):
            sl = slice(p0, p0 + step)
            cd = cand[sl]
            Y = vectors.gather(torch.where(cd >= 0, bk.slot[r[sl, None], cd.clamp(min=0)], -1))  # (Pc, c, D)
            cos[sl] = dot64_many(vectors.gather(nodes[sl]), Y, vectors.dtype)  # (Pc, c)
    w, _ = edge_weight(cos, me, _ends_at(bk, r[:, None], cand.clamp(min=0)), spanning, cap)
    top, _, j = top_by_key(w.masked_fill(cand < 0, float("-inf")), cand, k)
    bk.nbr[r, keep, :k] = top.to(bk.nbr.dtype)
    bk.cs[r, keep, :k] = cos.gather(1, j)
    bk.nbr[r, drop] = -1
    return sims


def tree_products_pay(r_np: np.ndarray, m: int, c: int) -> bool:
    """Whether a round's merged nodes are cheaper to score against their whole trees (one
    gather of m vectors per touched tree) than against their ``c`` candidates each (c
    gathered vectors per pair): when the pairs per touched tree outnumber ``m / c``. The
    ``matching`` schedule's rounds do, most ``sequential`` ones (a pair per tree) do not."""
    trees = len(np.unique(r_np))
    return len(r_np) * c > trees * m


def stale_entries(bk, moves: SlotMoves):
    """Point the touched rows' entries at the slots after the round, and say which entries
    need a new cosine: list entries of other slots that pointed at a merged pair, and time
    entries whose next live slot changed or merged. Writes ``bk.nbr[moves.rows]``.

    Shape: -> stale (R, m, k+1) bool (the node rows of an entry's ends follow from ``bk.slot`` and
           ``bk.nbr`` after the round, and are looked up only for the stale ones)
    """
    rows, after, merged, kept = moves
    R, m = after.shape
    S = bk.nbr[rows].long()  # (R, m, k+1)
    k = S.shape[2] - 1
    slot = bk.slot[rows]  # (R, m)
    live = slot >= 0
    t = S.clamp(min=0).view(R, -1)
    hit = (S >= 0) & merged.gather(1, t).view(R, m, k + 1)  # the entry points at a merged slot
    nxt = next_live(slot)
    fresh = kept[..., None]  # a merged slot's own list was re-ranked already
    stale_list = live[..., None] & ~fresh & hit[..., :k]  # (R, m, k)
    new_list = torch.where(stale_list, after.gather(1, t.view(R, m, k + 1)[..., :k].reshape(R, -1)).view(R, m, k),
                           S[..., :k])
    stale_time = live & ((nxt != S[..., k]) | hit[..., k] | kept)
    new = torch.cat([new_list, torch.where(live, nxt, torch.full_like(nxt, -1))[..., None]], 2)
    new = torch.where(live[..., None], new, torch.full_like(new, -1))
    bk.nbr[rows] = new.to(bk.nbr.dtype)
    return torch.cat([stale_list, stale_time[..., None]], 2) & (new >= 0)
