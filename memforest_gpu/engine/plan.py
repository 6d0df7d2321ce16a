"""One round's choice of pairs, for every tree of every tenant at once (SPEC sections 2-3).

Edge weights (:func:`~.edges.edge_weight`: cosine, optionally with the time and size terms
and the node-token cap) -> spanning forest -> degree-adjusted score
``w' = eta*w - (1-eta)*(deg_i+deg_j)`` -> candidates: the best edge of each tree
(``sequential``) or every tree edge (``matching``, then ONE greedy matching over the edges
of all buckets together). Under ``graph="knn"`` the forest of every bucket is built at once
on one flat edge list (:mod:`.candidates`); under ``graph="dense"`` (and the ablation kinds)
per bucket on its padded (B', m, m) matrix, as below. The chosen pairs of all buckets are
gathered on the device and copied to the host once: :class:`Plan` holds both the device
tensors (for ``apply_round``) and their host copy (for the merger's texts and the
bookkeeping). Two device->host reads per round (the number of pairs, then the pairs), plus
one per 8 matching iterations (and, on edge lists of a million edges or more, one per
compaction of the forest); none per tree, pair or tenant.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..config import CompressConfig
from ..kernels import best_edge_per_tree, greedy_matching, spanning_forest, tree_degrees
from ..kernels.mst import edge_key
from .candidates import forest_candidates
from .edges import Ends, edge_weight
from .trees import Bucket, TreeBatch

__all__ = ["Plan", "plan_round"]


@dataclass(frozen=True)
class Plan:
    """The pairs of one round, ordered by bucket, then tree row, then edge.

    Device tensors (P,): ``bucket``, ``row``, ``slot_a`` < ``slot_b``, ``tree``, ``score`` (w').
    Host arrays (P,): ``tree_np``, ``row_np``, ``node_a`` / ``node_b`` (node rows),
    ``similarity`` (cosine, float64); ``offsets`` (n_buckets + 1,) delimit each bucket's pairs.
    """

    bucket: torch.Tensor
    row: torch.Tensor
    slot_a: torch.Tensor
    slot_b: torch.Tensor
    tree: torch.Tensor
    score: torch.Tensor
    tree_np: np.ndarray
    row_np: np.ndarray
    node_a: np.ndarray
    node_b: np.ndarray
    similarity: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.tree_np)


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
    a = Ends(*(None if x is None else x[:, :, None] for x in e))
    b = Ends(*(None if x is None else x[:, None, :] for x in e))
    Wt, est = edge_weight(cos, a, b, cfg.tree, cap)  # (B', m, m)
    return Wt, W, est


#: most (tree, slot, slot) elements scored at a time: the edge terms make a few (B', m, m)
#: int64 / float temporaries, so a bucket of big trees is scored in slices of trees
EDGE_BUDGET = 1 << 25


def _scored_edges_chunked(bk: Bucket, r: torch.Tensor, cfg: CompressConfig, cap: int | None, rng,
                          budget: int | None = None):
    """:func:`_scored_edges` over slices of at most ``budget // m**2`` trees, concatenated.
    Trees are independent (and the random ablation draws its (B', m, m) weights in row-major
    order), so the result is the same as one call; only the temporaries are bounded."""
    step = max(1, (budget or EDGE_BUDGET) // max(1, bk.m * bk.m))
    if r.shape[0] <= step:
        return _scored_edges(bk, r, cfg, cap, rng)
    parts = [_scored_edges(bk, r[i:i + step], cfg, cap, rng) for i in range(0, r.shape[0], step)]
    return tuple(torch.cat(x) for x in zip(*parts))


def _scored_edges(bk: Bucket, r: torch.Tensor, cfg: CompressConfig, cap: int | None, rng):
    """Spanning-forest edges of the rows ``r`` with their degree-adjusted scores.
    Shape: -> u, v, score, key, eligible, cos (B', m-1)"""
    Wt, W, est = _edge_weights(bk, r, cfg, cap, rng)
    B, m, _ = W.shape
    u, v, w, ok = spanning_forest(Wt, bk.slot[r] >= 0, maximum=(cfg.tree.kind != "min"))
    deg = tree_degrees(u, v, ok, m)  # (B', m)
    dsum = (deg.gather(1, u) + deg.gather(1, v)).to(w.dtype)  # (B', E)
    if cfg.tree.degree_norm == "max":
        dsum = dsum / torch.where(ok, dsum, torch.zeros_like(dsum)).amax(1, keepdim=True).clamp(min=1)
    eta = cfg.tree.eta
    score = eta * w - (1 - eta) * dsum  # (B', E)
    brow = torch.arange(B, device=W.device)[:, None]
    eligible = ok if est is None or cap is None else ok & (est[brow, u, v] <= cap)
    cos = W[brow, u, v] if Wt is not W else w  # the similarity reported is always the cosine
    return u, v, score, edge_key(u, v, m), eligible, cos


def plan_round(batch: TreeBatch, need: np.ndarray, remaining: np.ndarray, cfg: CompressConfig,
               cap: int | None = None, rng: np.random.Generator | None = None) -> Plan:
    """The pairs every tree in ``need`` merges this round.

    ``need`` (T,) host bool: trees that still have to lose nodes; ``remaining`` (T,) host:
    how many (the matching schedule takes at most that many pairs in a tree). A tree in
    ``need`` with no pair in the plan has no eligible edge left (node cap).
    """
    dev = batch.vectors.device
    matching = cfg.merge.schedule == "matching"
    cat, off = _candidates(batch, need, cfg, cap, rng, matching)
    if cat is None:
        return _empty_plan(len(batch.buckets), dev)
    take = cat["take"]
    if matching:  # one greedy matching over every tree of every bucket, capped by each tree's quota
        quota = torch.as_tensor(remaining, dtype=torch.int64, device=dev)
        take = greedy_matching(cat["ga"][None], cat["gb"][None], cat["score"][None], cat["key"][None], take[None],
                               off, cap=quota, group=cat["tree"][None])[0]
    sel = torch.nonzero(take).flatten()  # host read 1: how many pairs
    bucket, row, sa, sb, tree_e, score, cos, node_a, node_b = (
        cat[k][sel] for k in ("bucket", "row", "a", "b", "tree", "score", "cos", "na", "nb"))
    packed = torch.stack([bucket, row, sa, sb, tree_e, node_a, node_b,
                          cos.to(torch.float64).view(torch.int64)], 1)  # (P, 8)
    host = packed.cpu().numpy()  # host read 2: the round's pairs
    counts = np.bincount(host[:, 0], minlength=len(batch.buckets))
    offsets = np.concatenate([[0], np.cumsum(counts)])
    return Plan(bucket, row, sa, sb, tree_e, score, host[:, 4].copy(), host[:, 1].copy(), host[:, 5].copy(),
                host[:, 6].copy(), host[:, 7].copy().view(np.float64), offsets)


def _candidates(batch: TreeBatch, need: np.ndarray, cfg: CompressConfig, cap: int | None, rng, matching: bool):
    """The round's candidate pairs of every tree in ``need``: trees of buckets that keep
    neighbour lists through the edge-list forest (:func:`~.candidates.forest_candidates`),
    trees of buckets that keep every pair through the padded path (several times cheaper
    for small trees), or every tree through the edge-list forest when ``knn_above`` is 0.
    A tree's candidates depend on its own edges only and both paths make the same plans
    on every pair (tests/test_sparse_trees.py), so the split changes no merge."""
    t = cfg.tree
    flat = np.zeros(len(need), dtype=bool)  # (T,) trees whose bucket keeps lists
    for bk in batch.buckets:
        flat[bk.trees_np] = bk.lists
    if t.graph == "knn" and t.kind == "max" and t.knn_above == 0:
        flat[:] = True
    parts = []
    n = 0
    if (need & flat).any():
        c, n = forest_candidates(batch, need & flat, cfg, cap, matching)
        parts += [c] if c is not None else []
    if (need & ~flat).any():
        c, n2 = _dense_candidates(batch, need & ~flat, cfg, cap, rng, matching)
        if c is not None:
            if matching:  # the padded path's vertex ids after the forest's
                c = dict(c, ga=c["ga"] + n, gb=c["gb"] + n)
            parts.append(c)
            n += n2
    if not parts:
        return None, 0
    keys = [k for k in parts[0] if all(k in c for c in parts)]  # sequential: the padded path has no keys
    return {k: torch.cat([c[k] for c in parts]) for k in keys}, n


def _dense_candidates(batch: TreeBatch, need: np.ndarray, cfg: CompressConfig, cap: int | None, rng,
                      matching: bool):
    """Per bucket of every pair, the padded (B', m, m) path: the candidate pairs as flat (C,)
    tensors (the best edge per tree, or every forest edge), and the vertex count of the
    matching's global ids (None when no tree plans)."""
    dev = batch.vectors.device
    cands = []  # per bucket, flat (C,) tensors: the candidate pairs (matching: every tree edge)
    off = 0  # matching: vertex ids made global over every (bucket, row), for one flat matching
    for b, bk in enumerate(batch.buckets):
        rows = np.flatnonzero(need[bk.trees_np])
        if len(rows) == 0:
            continue
        r = torch.as_tensor(rows, dtype=torch.int64, device=dev)
        u, v, score, key, ok, cos = _scored_edges_chunked(bk, r, cfg, cap, rng)
        B, E = u.shape
        if E == 0:
            continue
        slot = bk.slot[r]  # (B', m) node rows
        if matching:
            base = off + torch.arange(B, device=dev)[:, None] * bk.m  # (B', 1)
            off += B * bk.m
            c = dict(row=r[:, None].expand(B, E), a=u, b=v, tree=bk.trees[r][:, None].expand(B, E), score=score,
                     cos=cos, take=ok, key=key, ga=base + u, gb=base + v, na=slot.gather(1, u), nb=slot.gather(1, v))
        else:
            e = best_edge_per_tree(score, key, ok)  # (B',)
            j, ec = torch.arange(B, device=dev), e.clamp(min=0)
            ua, vb = u[j, ec], v[j, ec]
            c = dict(row=r, a=ua, b=vb, tree=bk.trees[r], score=score[j, ec], cos=cos[j, ec], take=e >= 0,
                     na=slot[j, ua], nb=slot[j, vb])
        c = {k: x.reshape(-1) for k, x in c.items()}
        c["bucket"] = torch.full_like(c["row"], b)
        cands.append(c)
    if not cands:
        return None, 0
    return {k: torch.cat([c[k] for c in cands]) for k in cands[0]}, off


def _empty_plan(n_buckets: int, dev) -> Plan:
    z = torch.zeros(0, dtype=torch.int64, device=dev)
    e = np.zeros(0, dtype=np.int64)
    return Plan(z, z, z, z, z, torch.zeros(0, device=dev), e, e, e, e, np.zeros(0), np.zeros(n_buckets + 1, np.int64))
