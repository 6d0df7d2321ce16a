"""The dense planner: candidate pairs of the trees of dense buckets, one padded (B', m, m)
matrix per bucket (:mod:`.trees`).

Per bucket: edge weights (:func:`~.edges.edge_weight` on the cosine matrix) -> the spanning
forest of every tree at once (:func:`~memforest_gpu.kernels.spanning_forest`) -> tree degrees
-> degree-adjusted scores (:func:`~.candidates.degree_adjusted`) -> the best edge of each
tree (``sequential``) or every forest edge (``matching``). A bucket of big trees is scored in
slices of trees so that the (B', m, m) temporaries stay bounded.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from ..config import CompressConfig
from ..kernels.blocks import for_device
from ..kernels.matching import best_edge_per_tree
from ..kernels.mst import edge_key, spanning_forest, tree_degrees
from .candidates import Candidates, degree_adjusted
from .edges import edge_weight
from .trees import Bucket, TreeBatch

__all__ = ["dense_candidates", "EDGE_BUDGET"]

#: most (tree, slot, slot) elements scored at a time, per device: the edge terms make a few
#: (B', m, m) int64 / float temporaries (the bucket's cosines gathered, the weights, the merged
#: lengths), so a bucket of big trees is scored in slices of trees (CPU: 8M elements, ~64 MB a
#: float64 temporary; 32M held ~600 MB at once, the paper preset's peak at 1M nodes)
EDGE_BUDGET = {"cpu": 1 << 23, "cuda": 1 << 25}


def dense_candidates(batch: TreeBatch, need: np.ndarray, cfg: CompressConfig, cap: int | None, rng,
                     matching: bool) -> tuple[Candidates | None, int]:
    """The candidate pairs of every tree in ``need`` (all in dense buckets), bucket by bucket,
    and the number of matching vertices they use (``None``, 0 when no tree plans).

    ``need`` (T,) host bool; ``cap``: the planner's node cap (``None``: none); ``rng``: the
    random ablation's generator.
    """
    dev = batch.vectors.device
    parts = []
    n_vertices = 0  # matching: vertex ids made global over every (bucket, row), for one flat matching
    for b, bk in enumerate(batch.buckets):
        rows = np.flatnonzero(need[bk.trees_np])
        if len(rows) == 0:
            continue
        r = torch.as_tensor(rows, dtype=torch.int64, device=dev)
        f = _scored_forest_sliced(bk, r, cfg, cap, rng)
        B, E = f.u.shape  # E: edges per tree of the forest (m - 1 slots, padded)
        if E == 0:
            continue
        slot = bk.slot[r]  # (B', m) node rows
        if matching:
            first = n_vertices + torch.arange(B, device=dev)[:, None] * bk.m  # (B', 1) each row's first vertex
            n_vertices += B * bk.m
            c = Candidates(bucket=torch.full((B, E), b, dtype=torch.int64, device=dev),
                           row=r[:, None].expand(B, E), tree=bk.trees[r][:, None].expand(B, E), slot_a=f.u,
                           slot_b=f.v, node_a=slot.gather(1, f.u), node_b=slot.gather(1, f.v), score=f.score,
                           similarity=f.similarity, eligible=f.eligible, tie_key=f.tie_key, vertex_a=first + f.u,
                           vertex_b=first + f.v)
        else:
            e = best_edge_per_tree(f.score, f.tie_key, f.eligible)  # (B',)
            j, ec = torch.arange(B, device=dev), e.clamp(min=0)
            ua, vb = f.u[j, ec], f.v[j, ec]
            c = Candidates(bucket=torch.full((B,), b, dtype=torch.int64, device=dev), row=r, tree=bk.trees[r],
                           slot_a=ua, slot_b=vb, node_a=slot[j, ua], node_b=slot[j, vb], score=f.score[j, ec],
                           similarity=f.similarity[j, ec], eligible=e >= 0)
        parts.append(c.flat())
    if not parts:
        return None, 0
    return Candidates.cat(parts), n_vertices


class _ScoredForest(NamedTuple):
    """The forest edges of some rows of a bucket. Shape: every field (B', m-1)."""

    u: torch.Tensor  # slot ends, u < v
    v: torch.Tensor
    score: torch.Tensor
    tie_key: torch.Tensor
    eligible: torch.Tensor
    similarity: torch.Tensor


def _scored_forest_sliced(bk: Bucket, r: torch.Tensor, cfg: CompressConfig, cap: int | None, rng,
                          budget: int | None = None) -> _ScoredForest:
    """:func:`_scored_forest` over slices of at most ``budget // m**2`` trees, concatenated.
    Trees are independent (and the random ablation draws its (B', m, m) weights in row-major
    order), so the result is the same as one call; only the temporaries are bounded."""
    budget = budget or for_device(EDGE_BUDGET, bk.slot.device)
    step = max(1, budget // max(1, bk.m * bk.m))
    if r.shape[0] <= step:
        return _scored_forest(bk, r, cfg, cap, rng)
    parts = [_scored_forest(bk, r[i:i + step], cfg, cap, rng) for i in range(0, r.shape[0], step)]
    return _ScoredForest(*(torch.cat(x) for x in zip(*parts)))


def _scored_forest(bk: Bucket, r: torch.Tensor, cfg: CompressConfig, cap: int | None, rng) -> _ScoredForest:
    """The spanning forest of the rows ``r`` with its edges' degree-adjusted scores."""
    Wt, W, est = _edge_weights(bk, r, cfg, cap, rng)  # edge weights, cosines (Bucket.W), est. merged lengths
    B, m, _ = W.shape
    u, v, w, ok = spanning_forest(Wt, bk.slot[r] >= 0, maximum=(cfg.tree.kind != "min"))
    deg = tree_degrees(u, v, ok, m)  # (B', m)
    E = u.shape[1]  # edges per tree (padded)
    tree_of = torch.arange(B, device=W.device)[:, None].expand(B, E)
    score = degree_adjusted(w.reshape(-1), (deg.gather(1, u) + deg.gather(1, v)).reshape(-1), ok.reshape(-1),
                            tree_of.reshape(-1), B, cfg.tree).view(B, E)
    brow = torch.arange(B, device=W.device)[:, None]
    eligible = ok if est is None or cap is None else ok & (est[brow, u, v] <= cap)
    similarity = W[brow, u, v] if Wt is not W else w  # the similarity reported is always the cosine
    return _ScoredForest(u, v, score, edge_key(u, v, m), eligible, similarity)


def _edge_weights(bk: Bucket, r: torch.Tensor, cfg: CompressConfig, cap: int | None, rng):
    """Weights the spanning tree is built on, the cosine of each pair, and the estimated
    merged length (or None). Shape: -> Wt, W (B', m, m), est (B', m, m) or None"""
    W = bk.W[r]  # (B', m, m)
    B, m, _ = W.shape
    cos = W
    if cfg.tree.kind == "random":  # ablation: a random spanning tree, random merge order
        Rw = torch.from_numpy(rng.random((B, m, m))).to(W.device, W.dtype)
        cos = torch.triu(Rw, 1) + torch.triu(Rw, 1).transpose(1, 2)
    e = bk.ends(r)  # (B', m)
    Wt, est = edge_weight(cos, e.at(np.s_[:, :, None]), e.at(np.s_[:, None, :]), cfg.tree, cap)
    return Wt, W, est
