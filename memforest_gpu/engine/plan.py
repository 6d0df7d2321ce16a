"""One round's choice of pairs, for every tree of every tenant at once (docs/method.md
sections 2-3).

Edge weights (:func:`~.edges.edge_weight`: the cosine, optionally with the time and size
terms and the node-token cap) -> spanning forest -> degree-adjusted score
``w' = eta*w - (1-eta)*(deg_i+deg_j)`` -> :class:`~.candidates.Candidates`: the best edge of
each tree (``sequential``) or every forest edge (``matching``, then ONE greedy matching over
the candidates of every bucket). The knn planner (:mod:`.plan_knn`) and the dense planner
(:mod:`.plan_dense`) make the candidates of their buckets (:mod:`.trees` says which).

The chosen pairs are copied to the host once: :class:`Plan` holds both the device tensors
(for ``apply_round``) and their host copy (for the merger's texts and the bookkeeping). One
device->host read per round (the pairs, padded to the most a round can take), plus one per 8
matching iterations (and, on edge lists of a million edges or more, one per compaction of the
forest); none per tree, pair or tenant.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..config import CompressConfig
from ..kernels.matching import greedy_matching
from .candidates import Candidates
from .plan_dense import dense_candidates
from .plan_knn import knn_candidates
from .trees import TreeBatch, knn_planned

__all__ = ["Plan", "plan_round"]


@dataclass(frozen=True, kw_only=True)
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

    @staticmethod
    def empty(n_buckets: int, device) -> Plan:
        z = torch.zeros(0, dtype=torch.int64, device=device)
        e = np.zeros(0, dtype=np.int64)
        return Plan(bucket=z, row=z, slot_a=z, slot_b=z, tree=z, score=torch.zeros(0, device=device), tree_np=e,
                    row_np=e, node_a=e, node_b=e, similarity=np.zeros(0), offsets=np.zeros(n_buckets + 1, np.int64))


#: the columns of a plan's one host copy, in order (the similarity travels as the bits of a float64)
_HOST_COLUMNS = ("bucket", "row", "tree", "node_a", "node_b", "similarity")


def plan_round(batch: TreeBatch, need: np.ndarray, remaining: np.ndarray, cfg: CompressConfig,
               cap: int | None = None, rng: np.random.Generator | None = None) -> Plan:
    """The pairs every tree in ``need`` merges this round.

    ``need`` (T,) host bool: trees that still have to lose nodes; ``remaining`` (T,) host:
    how many (the matching schedule takes at most that many pairs in a tree). A tree in
    ``need`` with no pair in the plan has no eligible edge left (node cap).
    """
    dev = batch.vectors.device
    matching = cfg.merge.schedule == "matching"
    c, n_vertices = _candidates(batch, need, cfg, cap, rng, matching)
    if c is None:
        return Plan.empty(len(batch.buckets), dev)
    take = c.eligible
    if matching:  # one greedy matching over every tree of every bucket, capped by each tree's quota
        quota = torch.as_tensor(remaining, dtype=torch.int64, device=dev)
        take = greedy_matching(c.vertex_a[None], c.vertex_b[None], c.score[None], c.tie_key[None], take[None],
                               n_vertices, cap=quota, group=c.tree[None])[0]
    # no host read for the count: at most `bound` pairs are taken (a candidate each; the matching
    # takes at most each tree's quota), their indices padded with -1 to that length
    bound = int(take.shape[0]) if not matching else min(int(take.shape[0]), int(np.asarray(remaining).sum()))
    torch._assert_async(take.sum() <= bound)
    idx = torch.nonzero_static(take, size=bound, fill_value=-1)[:, 0]  # (bound,) taken candidates first
    p = c.take(idx.clamp(min=0))
    packed = torch.stack([idx, p.bucket, p.row, p.tree, p.node_a, p.node_b,
                          p.similarity.to(torch.float64).view(torch.int64)], 1)  # (bound, 7)
    rows = packed.numpy(force=True)  # the round's one host read: its pairs
    n_pairs = int(np.count_nonzero(rows[:, 0] >= 0))
    p = p.take(slice(0, n_pairs))
    host = dict(zip(_HOST_COLUMNS, rows[:n_pairs, 1:].T.copy()))
    counts = np.bincount(host["bucket"], minlength=len(batch.buckets))
    return Plan(bucket=p.bucket, row=p.row, slot_a=p.slot_a, slot_b=p.slot_b, tree=p.tree, score=p.score,
                tree_np=host["tree"], row_np=host["row"], node_a=host["node_a"], node_b=host["node_b"],
                similarity=host["similarity"].view(np.float64), offsets=np.concatenate([[0], np.cumsum(counts)]))


def _candidates(batch: TreeBatch, need: np.ndarray, cfg: CompressConfig, cap: int | None, rng,
                matching: bool) -> tuple[Candidates | None, int]:
    """The round's candidates of every tree in ``need``, the knn planner's first, and the
    number of matching vertices. A tree's candidates depend on its own edges only and both
    planners make the same plan on the same edges (tests/test_knn_graph.py), so the split
    changes no merge."""
    by_knn = np.zeros(len(need), dtype=bool)  # (T,) trees the knn planner plans
    for bk in batch.buckets:
        by_knn[bk.trees_np] = knn_planned(bk.graph, cfg.tree)
    parts, n = [], 0
    if (need & by_knn).any():
        c, n = knn_candidates(batch, need & by_knn, cfg, cap, matching)
        parts += [c] if c is not None else []
    if (need & ~by_knn).any():
        c, n_dense = dense_candidates(batch, need & ~by_knn, cfg, cap, rng, matching)
        if c is not None:
            parts.append(c.with_vertex_offset(n) if matching else c)  # the dense planner's vertices after the knn's
            n += n_dense
    if not parts:
        return None, 0
    return Candidates.cat(parts), n
