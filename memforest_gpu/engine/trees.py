"""The trees of a run and their candidate graphs, on the device: what every merge round works on.

:func:`build_trees` lays out every tree of every tenant once. Trees of similar size share a
:class:`Bucket` of B trees padded to m slots: node rows, timestamps, token counts, each
slot's span of positions, and the candidate graph the spanning tree is built on, kept
current one row per merge: the dense graph (every pair's cosine, (B, m, m)) for buckets of
small trees, else the knn graph (each slot's ``knn`` best neighbours and its next slot in
time, (B, m, knn + 1)). Slots are in time order inside a tree, so a slot index is a stable
tie key. :func:`~memforest_gpu.engine.apply.apply_round` updates these tensors in place
after each round; nothing here reads a value back to the host.

Here: the buckets (:class:`Bucket`, :class:`BucketLayout`, :func:`build_trees`) and which graph
a bucket keeps (:func:`bucket_graph`). The vectors every bucket reads by node row (no padded
(B, m, D) copy) are :mod:`.node_vectors`; the knn graph, built and kept current after a round,
is :mod:`.knn_graph`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from ..config import SpanningConfig
from ..kernels.blocks import for_device
from ..kernels.padding import size_buckets
from .edges import Ends, ends_of
from .knn_graph import build_knn_graph
from .node_vectors import NodeVectors, compute_dtype
from .partition import time_order

__all__ = ["Bucket", "BucketLayout", "build_trees", "DENSE", "KNN", "bucket_graph", "knn_planned"]


@dataclass(frozen=True)
class Bucket:
    """B trees padded to m slots. Tensors are updated in place by ``apply_round``.

    The candidate graph is the dense graph (``W``: the cosine matrix,
    kept current one row/column per merge) or the knn graph (``nbr`` / ``cs``: per slot its
    ``knn`` best neighbours' slots and their cosines, then its next live slot in time; see
    :mod:`.knn_graph`). ``lo`` / ``hi`` are positions in the tenant's time order (a node's
    span), not offsets into a plan.

    Shape: trees (B,), slot (B, m) node row (-1 = empty), ts (B, m) float64, tok (B, m) int64
           or None, lo / hi (B, m) int64 first and last position of each slot's originals,
           W (B, m, m) or None, nbr (B, m, k+1) int32 (-1 = none) or None, cs (B, m, k+1) or None,
           sizes (B,) host: each tree's nodes at the layout (its live slots stay in that prefix)
    """

    trees: torch.Tensor
    trees_np: np.ndarray  # host copy of ``trees`` (known when the batch is laid out)
    slot: torch.Tensor
    ts: torch.Tensor
    tok: torch.Tensor | None
    lo: torch.Tensor
    hi: torch.Tensor
    W: torch.Tensor | None = None
    nbr: torch.Tensor | None = None
    cs: torch.Tensor | None = None
    sizes: np.ndarray | None = None

    @property
    def m(self) -> int:
        return int(self.slot.shape[1])

    @property
    def graph(self) -> str:
        """The candidate graph the bucket keeps: ``"knn"`` (``nbr`` / ``cs``) or ``"dense"``
        (``W``)."""
        return KNN if self.nbr is not None else DENSE

    def ends(self, r: torch.Tensor | slice = slice(None)) -> Ends:
        """The edge-weight attributes of rows ``r``. Shape: -> (B', m) each"""
        return ends_of(self.lo[r], self.hi[r], None if self.tok is None else self.tok[r], self.ts[r])


@dataclass(frozen=True)
class BucketLayout:
    """The layout of a run's trees: every tree with at least two nodes, laid out once in
    padded buckets by size (largest first).
    ``bucket_of`` / ``row_of`` (T,) locate tree ``t`` (-1 for one-node trees); ``vectors``
    holds every node's vector by node row; ``spanning`` (a
    :class:`~memforest_gpu.config.SpanningConfig`) and ``cap`` are the settings the knn graph is
    ranked by (kept for its updates)."""

    buckets: tuple[Bucket, ...]
    bucket_of: np.ndarray
    row_of: np.ndarray
    vectors: NodeVectors
    spanning: SpanningConfig | None = None
    cap: int | None = None


#: (tree, slot, slot + dim) elements of a dense bucket's cosines made at a time, per device: the
#: products make three float64 temporaries of a block (CPU 8M elements: 32M held ~600 MB at once)
COSINE_BLOCK = {"cpu": 1 << 23, "cuda": 1 << 25}


def _cosines(vectors: NodeVectors, slots: torch.Tensor) -> torch.Tensor:
    """(B, m, m) cosines of the trees' slots, accumulated in float64 and made exactly
    symmetric, so a value never depends on which other trees share the batch (ties must stay
    ties). A block of trees at a time: :data:`COSINE_BLOCK` elements of the trees' float64
    vectors and products (CPU: ~64 MB a temporary). Half-precision vectors give float32 cosines."""
    B, m = slots.shape
    W = torch.empty(B, m, m, dtype=compute_dtype(vectors.dtype), device=slots.device)
    tile_elements = for_device(COSINE_BLOCK, slots.device)
    step = max(1, tile_elements // max(1, m * (m + vectors.dim)))  # the (step, m, D) gather counts too
    for b0 in range(0, B, step):
        Xd = vectors.gather(slots[b0:b0 + step]).double()  # (step, m, D), zeros in empty slots
        S = Xd @ Xd.transpose(1, 2)
        W[b0:b0 + step] = ((S + S.transpose(1, 2)) * 0.5).to(vectors.dtype)
    return W


def build_trees(tree: torch.Tensor, tree_size: np.ndarray, embeddings: torch.Tensor, timestamps: torch.Tensor,
                codes: torch.Tensor, tokens: torch.Tensor | None, *, dtype: torch.dtype | None = None,
                config: SpanningConfig | None = None, cap: int | None = None, tile_elements: int = 1 << 24,
                merges: int = 0, reuse: bool = False, save_codes: bool = False) -> BucketLayout:
    """Lay out every tree of ``tree`` (global tree id per node, as in a
    :class:`~.partition.Partition`) as padded buckets.

    ``dtype``: storage dtype of the vectors (default the embeddings'; float16 / bfloat16
    halve them, similarities are still accumulated in float64). ``config``: the spanning stage's
    settings (its ``graph`` / ``knn`` choose each bucket's candidate graph, its edge terms
    and ``cap`` (the planner's) rank the knn graph's neighbours; default the dense graph).
    No padded copy of the vectors is kept: buckets hold node rows (``BucketLayout.vectors``, with
    room for ``merges`` merged vectors; ``reuse``: none, merged vectors take dead rows of
    ``embeddings`` itself, see :meth:`~.node_vectors.NodeVectors.put`).

    Shape: tree (N,), tree_size (T,) host, embeddings (N, D), timestamps (N,), codes (N,),
           tokens (N,) or None -> BucketLayout
    """
    vectors = NodeVectors(embeddings, dtype or embeddings.dtype, capacity=merges, reuse=reuse, save_codes=save_codes)
    dev = embeddings.device
    N = embeddings.shape[0]
    T = len(tree_size)
    order = torch.argsort(timestamps, stable=True)  # slots in time order inside each tree
    items = order[torch.argsort(tree[order], stable=True)]  # (N,) node ids by (tree, time, index)
    start = torch.as_tensor(np.cumsum(tree_size) - tree_size, dtype=torch.int64, device=dev)  # (T,)
    size_t = torch.as_tensor(np.asarray(tree_size, dtype=np.int64), device=dev)  # (T,)
    pos = torch.empty(N, dtype=torch.int64, device=dev)  # rank by (tenant, time, index), exact at any N
    pos[time_order(codes, timestamps)] = torch.arange(N, dtype=torch.int64, device=dev)
    bucket_of = np.full(T, -1, dtype=np.int64)
    row_of = np.full(T, -1, dtype=np.int64)
    buckets = []
    # trees by size class (powers of two: padding wastes at most half), largest first; the
    # sizes are a host array, so this reads nothing from the device
    classes = size_buckets(torch.as_tensor(np.asarray(tree_size, dtype=np.int64)), min_size=2)
    for b, ids in enumerate(c.numpy() for c in classes):
        m = int(tree_size[ids].max())
        trees = torch.as_tensor(ids, dtype=torch.int64, device=dev)
        col = torch.arange(m, dtype=torch.int64, device=dev)
        ok = col[None, :] < size_t[trees][:, None]  # (B, m): each bucket cut from the sorted order,
        at = (start[trees][:, None] + col[None, :]).clamp(max=max(N - 1, 0))  # never a (T, largest) index
        slots = torch.where(ok, items[at], torch.full_like(at, -1))  # (B, m)
        s0 = slots.clamp(min=0)
        lo = pos[s0]
        bk = Bucket(trees, ids, slots, timestamps[s0].to(torch.float64), tokens[s0] if tokens is not None else None,
                    lo, lo.clone(), sizes=np.asarray(tree_size[ids], dtype=np.int64))
        if bucket_graph(config, m) == KNN:
            nbr, cs = build_knn_graph(bk, vectors, config, cap, tile_elements=tile_elements)
            bk = dataclasses.replace(bk, nbr=nbr, cs=cs)
        else:
            bk = dataclasses.replace(bk, W=_cosines(vectors, slots))
        buckets.append(bk)
        bucket_of[ids] = b
        row_of[ids] = np.arange(len(ids))
    return BucketLayout(tuple(buckets), bucket_of, row_of, vectors, config, cap)


# Which candidate graph a bucket of trees keeps, and which planner plans its trees.
#
# The spanning tree of an event tree is built on one of two graphs (``SpanningConfig.graph``):
#
# - ``"dense"``: every pair, the padded (m, m) cosine matrix of each tree (``Bucket.W``);
# - ``"knn"``: per node its ``knn`` best neighbours by edge weight and its next node in time
#   (``Bucket.nbr`` / ``Bucket.cs``, :mod:`.trees`).
#
# Under ``graph="knn"`` a bucket of trees padded to ``m`` slots still keeps the dense graph
# when its trees have at most ``knn + 1`` nodes (the knn graph would hold every pair) or
# when ``m <= knn_above`` (a small tree's matrix costs about what its lists do, and its
# rounds are several times cheaper). The ablation kinds ``"min"`` and ``"random"`` always
# keep the dense graph.
#
# Two planners build the round's spanning forests: the dense planner (:mod:`.plan`)
# on each dense bucket's matrices, the knn planner (:mod:`.plan`) on one edge list of
# every knn bucket. With ``knn_above = 0`` the knn planner plans the dense buckets too
# (their every pair as edges); both planners make the same plan on the same edges.
DENSE, KNN = "dense", "knn"


def bucket_graph(spanning: SpanningConfig | None, m: int) -> str:
    """The graph a bucket of trees padded to ``m`` slots keeps: ``"knn"`` or ``"dense"``
    (``spanning=None``: dense)."""
    s = spanning
    if s is not None and s.graph == KNN and s.kind == "max" and m - 1 > s.knn and m > s.knn_above:
        return KNN
    return DENSE


def knn_planned(graph: str, spanning: SpanningConfig) -> bool:
    """Whether the trees of a bucket keeping ``graph`` are planned by the knn planner."""
    return graph == KNN or (spanning.graph == KNN and spanning.kind == "max" and spanning.knn_above == 0)
