"""The candidate pairs of a round, as both planners hand them to :func:`~.plan.plan_round`,
and the degree-adjusted score they are ranked by (docs/method.md section 2).

A candidate is a spanning-forest edge of a tree that plans this round: under ``sequential``
the best edge of each tree, under ``matching`` every forest edge (the round's greedy
matching then picks among them). The dense planner (:mod:`.plan_dense`) and the knn
planner (:mod:`.plan_knn`) both return :class:`Candidates`; the plan concatenates them.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..config import TreeConfig

__all__ = ["Candidates", "degree_adjusted"]


@dataclass(frozen=True)
class Candidates:
    """Candidate pairs, flat over every planning tree, in (bucket, tree row, tie key) order.

    Shape: every field (C,):
        bucket, row      the pair's bucket and its tree's row in it
        tree             global tree id
        slot_a, slot_b   the two slots, ``slot_a < slot_b``
        node_a, node_b   their node rows
        score            the degree-adjusted score w' the pairs are ranked by
        similarity       the cosine of the two nodes (what the merge log reports)
        eligible         bool: the pair may merge (a forest edge that fits the node cap)
        tie_key          ``slot_a * m + slot_b``: orders pairs of equal score inside a tree
        vertex_a, vertex_b  vertex ids unique over the round (the matching's); ``None`` where
                         a planner has no use for them (the dense planner under ``sequential``)
    """

    bucket: torch.Tensor
    row: torch.Tensor
    tree: torch.Tensor
    slot_a: torch.Tensor
    slot_b: torch.Tensor
    node_a: torch.Tensor
    node_b: torch.Tensor
    score: torch.Tensor
    similarity: torch.Tensor
    eligible: torch.Tensor
    tie_key: torch.Tensor | None = None
    vertex_a: torch.Tensor | None = None
    vertex_b: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.tree.shape[0])

    def map(self, fn) -> Candidates:
        """``fn`` applied to every field that is present."""
        return Candidates(**{f.name: None if (x := getattr(self, f.name)) is None else fn(x)
                             for f in dataclasses.fields(self)})

    def take(self, index: torch.Tensor) -> Candidates:
        """The candidates at ``index`` (indices or a boolean mask)."""
        return self.map(lambda x: x[index])

    def flat(self) -> Candidates:
        """Every field reshaped to (C,) (planners build them (B', E))."""
        return self.map(lambda x: x.reshape(-1))

    def with_vertex_offset(self, n: int) -> Candidates:
        """The same pairs with vertex ids shifted by ``n`` (placed after another planner's)."""
        return dataclasses.replace(self, vertex_a=self.vertex_a + n, vertex_b=self.vertex_b + n)

    @staticmethod
    def cat(parts: list[Candidates]) -> Candidates:
        """The candidates of ``parts`` one after the other; a field that some part lacks is
        ``None``."""
        out = {}
        for f in dataclasses.fields(Candidates):
            xs = [getattr(c, f.name) for c in parts]
            out[f.name] = None if any(x is None for x in xs) else torch.cat(xs)
        return Candidates(**out)


def degree_adjusted(w: torch.Tensor, deg_sum: torch.Tensor, eligible: torch.Tensor, tree_of: torch.Tensor,
                    n_trees: int, tree: TreeConfig) -> torch.Tensor:
    """The score of each forest edge: ``w' = eta * w - (1 - eta) * (deg_i + deg_j)``, with
    ``degree_norm="max"`` dividing ``deg_i + deg_j`` by its largest value over the eligible
    edges of the edge's tree (at least 1).

    Shape: w, deg_sum, eligible, tree_of (E,) (tree_of: each edge's tree in [0, n_trees)) ->
           (E,) in w's dtype
    """
    dsum = deg_sum.to(w.dtype)
    if tree.degree_norm == "max":
        top = torch.zeros(n_trees, dtype=dsum.dtype, device=dsum.device)
        top = top.scatter_reduce(0, tree_of, torch.where(eligible, dsum, torch.zeros_like(dsum)), "amax")
        dsum = dsum / top[tree_of].clamp(min=1)
    eta = tree.eta
    return eta * w - (1 - eta) * dsum
