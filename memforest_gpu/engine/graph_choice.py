"""Which candidate graph a bucket of trees keeps, and which planner plans its trees.

The spanning tree of a tree is built on one of two graphs (``TreeConfig.graph``):

- ``"dense"``: every pair, the padded (m, m) cosine matrix of each tree (``Bucket.W``);
- ``"knn"``: per node its ``knn`` best neighbours by edge weight and its next node in time
  (``Bucket.nbr`` / ``Bucket.cs``, :mod:`.knn_graph`).

Under ``graph="knn"`` a bucket of trees padded to ``m`` slots still keeps the dense graph
when its trees have at most ``knn + 1`` nodes (the knn graph would hold every pair) or
when ``m <= knn_above`` (a small tree's matrix costs about what its lists do, and its
rounds are several times cheaper). The ablation kinds ``"min"`` and ``"random"`` always
keep the dense graph.

Two planners build the round's spanning forests: the dense planner (:mod:`.plan_dense`)
on each dense bucket's matrices, the knn planner (:mod:`.plan_knn`) on one edge list of
every knn bucket. With ``knn_above = 0`` the knn planner plans the dense buckets too
(their every pair as edges); both planners make the same plan on the same edges.
"""
from __future__ import annotations

from ..config import TreeConfig

__all__ = ["DENSE", "KNN", "bucket_graph", "knn_planned"]

DENSE, KNN = "dense", "knn"


def bucket_graph(tree: TreeConfig | None, m: int) -> str:
    """The graph a bucket of trees padded to ``m`` slots keeps: ``"knn"`` or ``"dense"``
    (``tree=None``: dense)."""
    if tree is not None and tree.graph == KNN and tree.kind == "max" and m - 1 > tree.knn and m > tree.knn_above:
        return KNN
    return DENSE


def knn_planned(graph: str, tree: TreeConfig) -> bool:
    """Whether the trees of a bucket keeping ``graph`` are planned by the knn planner."""
    return graph == KNN or (tree.graph == KNN and tree.kind == "max" and tree.knn_above == 0)
