"""The trees of a run and their candidate graphs, on the device: what every merge round works on.

:func:`build_trees` lays out every tree of every tenant once. Trees of similar size share a
:class:`Bucket` of B trees padded to m slots: node rows, timestamps, token counts, each
slot's span of positions, and the candidate graph the spanning tree is built on, kept
current one row per merge: the dense graph (every pair's cosine, (B, m, m)) for buckets of
small trees, else the knn graph (each slot's ``knn`` best neighbours and its next slot in
time, (B, m, knn + 1)). Slots are in time order inside a tree, so a slot index is a stable
tie key. :func:`~memforest_gpu.engine.apply.apply_round` updates these tensors in place
after each round; nothing here reads a value back to the host.

Read top to bottom: the buckets (:class:`Bucket`, :class:`BucketLayout`, :func:`build_trees`);
the vectors every bucket reads by node row (:class:`NodeVectors`: no padded (B, m, D) copy);
the knn graph (:func:`build_knn_graph`, and after a round :func:`merged_lists` and
:func:`stale_entries`).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from ..config import SpanningConfig
from ..kernels.blocks import for_device, stream_rows
from ..kernels.knn import knn_cells, top_by_key
from ..kernels.padding import size_buckets
from ..store.codes import int8_codes_on
from .edges import Ends, edge_weight, ends_of
from .partition import time_order

__all__ = ["Bucket", "BucketLayout", "build_trees", "DENSE", "KNN", "bucket_graph", "knn_planned", "NodeVectors",
           "compute_dtype", "dot64", "dot64_many", "row_sims", "build_knn_graph", "next_live", "merged_lists",
           "stale_entries", "tree_products_pay", "SLOT_DTYPE", "RoundPairs", "SlotMoves"]


@dataclass(frozen=True)
class Bucket:
    """B trees padded to m slots. Tensors are updated in place by ``apply_round``.

    The candidate graph (:mod:`.trees`) is the dense graph (``W``: the cosine matrix,
    kept current one row/column per merge) or the knn graph (``nbr`` / ``cs``: per slot its
    ``knn`` best neighbours' slots and their cosines, then its next live slot in time; see
    :mod:`.trees`). ``lo`` / ``hi`` are positions in the tenant's time order (a node's
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
    ``embeddings`` itself, see :meth:`~.trees.NodeVectors.put`).

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


# ------------------------------------------------------------------------------
# The vector of every node of a run, by node row: the store's rows, then the merged nodes.
#
# Trees keep node rows, not vectors: a bucket gathers the vectors it needs when it needs them
# (building its graph, re-scoring a merged node), so no padded (B, m, D) copy lives for the
# run. Rows ``0..N-1`` are the store's nodes (the embeddings themselves when they are already
# in the storage dtype, else one converted copy); merged nodes are appended in the order the
# :class:`~memforest_gpu.engine.node_table.NodeTable` numbers them.
# ------------------------------------------------------------------------------

HALF = (torch.float16, torch.bfloat16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of similarities for vectors stored in ``dtype``: float32 for a half storage."""
    return torch.float32 if dtype in HALF else dtype


def dot64(x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Dot products of vector pairs accumulated in float64 (the products first, then one sum
    over D, so dot(x, y) and dot(y, x) are the same bits), in the similarities' dtype of
    vectors stored in ``dtype``. Callers bound the (..., D) float64 temporary.

    Shape: x, y broadcastable (..., D) -> (...)
    """
    return (x.double() * y.double()).sum(-1).to(compute_dtype(dtype))


def dot64_many(x: torch.Tensor, Y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Dot products of each vector with its own set of vectors, accumulated in float64 by a
    batched matrix-vector product (no (..., c, D) float64 product is made), in the
    similarities' dtype. Equal to :func:`dot64` up to the float64 summation order, so the two
    agree after rounding to float32 save for values within 1e-16 of a rounding boundary.

    Shape: x (..., D), Y (..., c, D) -> (..., c)
    """
    lead = Y.shape[:-2]
    c, D = Y.shape[-2:]
    Yd = Y.reshape(-1, c, D).double()
    xd = x.expand(*lead, D).reshape(-1, D, 1).double()
    return torch.bmm(Yd, xd).view(*lead, c).to(compute_dtype(dtype))


class NodeVectors:
    """Node row -> vector, for the store's rows and the merged nodes appended after them.

    Shape: base (N, D); :meth:`gather` rows (...) -> (..., D) in the storage dtype, zeros at
           rows < 0
    """

    def __init__(self, base: torch.Tensor, dtype: torch.dtype | None = None, *, capacity: int = 0,
                 reuse: bool = False, save_codes: bool = False):
        self.dtype = dtype or base.dtype
        self.base = base if base.dtype == self.dtype else base.to(self.dtype)
        self.n_base = int(base.shape[0])
        self.reuse = reuse
        if reuse:  # see :meth:`put`
            if self.base is not base:
                raise ValueError("reuse needs the vectors in their storage dtype (the table is the caller's tensor)")
            self._pos = torch.arange(self.n_base + capacity, dtype=torch.int64, device=base.device)
            self._held = np.ones(self.n_base, dtype=bool)  # storage row still holds its own input row's vector
            self.save_codes = save_codes
            self.saved: list[tuple[np.ndarray, np.ndarray]] = []  # (input rows, their int8 codes) per put
            self._extra = torch.zeros(1, base.shape[1], dtype=self.dtype, device=base.device)
            self._n_extra = 0
            return
        # merged nodes' vectors from row 1 on (room for ``capacity`` of them, the run's merges,
        # so the table is never copied to grow); row 0 stays zero: what an empty slot (-1) reads.
        # Left uninitialised past row 0 (only written rows are ever read), so on the CPU its
        # pages become resident as merges fill them, not all at the start
        self._extra = torch.empty(1 + capacity, base.shape[1], dtype=self.dtype, device=base.device)
        self._extra[0] = 0
        self._n_extra = 0

    @property
    def dim(self) -> int:
        return int(self.base.shape[1])

    @property
    def device(self) -> torch.device:
        return self.base.device

    def append(self, rows: np.ndarray, vectors: torch.Tensor) -> torch.Tensor:
        """Store the vectors of merged nodes ``rows`` (consecutive, right after the last ones).
        Returns them in the storage dtype. ``vectors`` may be :meth:`next_rows` itself (written
        in place: nothing is copied). Shape: rows (P,) host, vectors (P, D) -> (P, D)"""
        P = len(rows)
        if P and (int(rows[0]) != self.n_base + self._n_extra or int(rows[-1]) != int(rows[0]) + P - 1):
            raise ValueError(f"rows must continue the table at {self.n_base + self._n_extra}, got "
                             f"{int(rows[0])}..{int(rows[-1])}")
        if self.reuse:
            raise ValueError("a table that reuses its rows takes merged vectors by put(rows, at, vectors)")
        dst = self.next_rows(P)
        if not (vectors.dtype == self.dtype and vectors.device == dst.device and vectors.shape == dst.shape
                and vectors.data_ptr() == dst.data_ptr()):
            dst.copy_(vectors)
        self._n_extra += P
        return dst

    def next_rows(self, P: int) -> torch.Tensor:
        """The table's rows the next ``P`` merged vectors go to (grown first if needed), for a
        caller that computes them in place; they count once :meth:`append` is called with them.
        Shape: -> (P, D), a view in the storage dtype"""
        need = 1 + self._n_extra + P
        if need > self._extra.shape[0]:  # grow by doubling: the copies cost O(merges) in all
            grown = torch.zeros(max(need, 2 * self._extra.shape[0], 1024), self.dim, dtype=self.dtype,
                                device=self.device)
            grown[: 1 + self._n_extra] = self._extra[: 1 + self._n_extra]
            self._extra = grown
        return self._extra[1 + self._n_extra:need]

    def put(self, rows: np.ndarray, at: np.ndarray, vectors: torch.Tensor) -> None:
        """Reuse mode: the merged nodes ``rows`` (consecutive, as :meth:`append`) take the
        storage rows ``at`` of the table itself, each the row of the node's earliest original
        (one of its two parents' rows: dead once they merge), so no row is added: the run's
        vectors stay the input's (N, D). With ``save_codes``, the int8 codes of input rows whose
        own vector a put overwrites are kept first (:attr:`saved`: the output's keys read them).
        Shape: rows, at (P,) host, vectors (P, D)"""
        rows, at = np.asarray(rows, dtype=np.int64), np.asarray(at, dtype=np.int64)
        P = len(rows)
        if not P:
            return
        if (int(rows[0]) != self.n_base + self._n_extra or int(rows[-1]) != int(rows[0]) + P - 1):
            raise ValueError(f"rows must continue the table at {self.n_base + self._n_extra}, got "
                             f"{int(rows[0])}..{int(rows[-1])}")
        dev = self.device
        held = at[self._held[at]]
        if self.save_codes and len(held):  # kept on the device: no host copy in a round
            self.saved.append((held, int8_codes_on(self.base.index_select(0, torch.as_tensor(held, device=dev)))))
        self._held[held] = False
        need = self.n_base + self._n_extra + P
        if need > self._pos.shape[0]:
            self._pos = torch.cat([self._pos, torch.zeros(max(need - self._pos.shape[0], self._pos.shape[0]),
                                                          dtype=torch.int64, device=dev)])
        t = torch.as_tensor(at, dtype=torch.int64, device=dev)
        self.base.index_copy_(0, t, vectors.to(device=dev, dtype=self.dtype))
        self._pos[int(rows[0]):need] = t
        self._n_extra += P

    def merged(self) -> torch.Tensor:
        """The merged nodes' vectors so far, in the storage dtype. Shape: -> (M, D), a view"""
        return self._extra[1:1 + self._n_extra]

    def dot_rows(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """:func:`dot64` of the vectors of node rows ``a`` and ``b``, a cache-sized block of
        pairs at a time (:func:`~memforest_gpu.kernels.blocks.stream_rows`).
        Shape: a, b (P,) -> (P,)"""
        out = torch.empty(a.shape[0], dtype=compute_dtype(self.dtype), device=a.device)
        step = stream_rows(a.device, self.dim * 32)  # two rows gathered, converted, multiplied
        for i in range(0, a.shape[0], step):
            out[i:i + step] = dot64(self.gather(a[i:i + step]), self.gather(b[i:i + step]), self.dtype)
        return out

    def gather(self, rows: torch.Tensor) -> torch.Tensor:
        """Vectors of node ``rows`` (zeros where a row is negative: an empty slot)."""
        flat = rows.reshape(-1)
        if self.reuse:
            out = self.base.index_select(0, self._pos[flat.clamp(min=0)])
            return out.masked_fill_((flat < 0)[:, None], 0).view(*rows.shape, self.dim)
        if self._n_extra == 0:  # no merged vector yet (the trees' layout): one gather; any other row reads zeros
            out = self.base.index_select(0, flat.clamp(min=0, max=max(self.n_base - 1, 0)))
            return out.masked_fill_(((flat < 0) | (flat >= self.n_base))[:, None], 0).view(*rows.shape, self.dim)
        stored = (flat >= 0) & (flat < self.n_base)
        out = self.base.index_select(0, flat.clamp(min=0, max=max(self.n_base - 1, 0)))
        ext = self._extra.index_select(0, torch.where(flat >= self.n_base, flat - self.n_base + 1, 0))  # 0: zeros
        return torch.where(stored[:, None], out, ext).view(*rows.shape, self.dim)


def row_sims(vectors: NodeVectors, slot: torch.Tensor, r: np.ndarray, E: torch.Tensor, *,
             pmax: int | None = None, sizes: np.ndarray | None = None) -> torch.Tensor:
    """Similarity of each new vector to every slot of its tree, accumulated in float64.

    Pairs of one tree share one gather of that tree (the matching schedule puts up to m/2
    pairs in a tree, so gathering per pair would cost O(m^2 D) memory per tree); trees are
    processed a few at a time (:func:`~memforest_gpu.kernels.blocks.stream_rows`: a
    cache-sized block on the CPU). ``r`` is a host array (the plan's host copy), so the
    grouping costs no device read.

    Shape: slot (B, m) node rows, r (P,) host row of each pair, E (P, D) new vectors, or (P,) the
           node rows of new vectors already in ``vectors`` (read a chunk at a time) -> (P, m) in
           vectors' dtype (float32 for half precision); pmax: the width of each tree's block of
           new vectors (at least the most pairs of a tree in ``r``; a caller splitting a round
           passes the round's, so the products have the same shapes whatever the split); sizes
           (B,) host: each tree's slots that can be live (:attr:`Bucket.sizes`): the products of
           a block of trees stop at its largest, the slots past it read 0 as padding does
    """
    P, D = E.shape[0], vectors.dim
    m = slot.shape[1]
    dev = slot.device
    rows, inv = np.unique(np.asarray(r, dtype=np.int64), return_inverse=True)  # (R,), (P,)
    inv = inv.reshape(-1)
    R = len(rows)
    counts = np.bincount(inv, minlength=R)
    order = np.argsort(inv, kind="stable")  # pairs grouped by tree
    start = np.cumsum(counts) - counts  # (R,) each tree's first pair in ``order``
    col = np.empty(P, dtype=np.int64)
    col[order] = np.arange(P) - start[inv[order]]
    pmax = max(int(counts.max()) if P else 0, pmax or 0)
    sizes = None if sizes is None else np.asarray(sizes)
    # with sizes, the columns past a block's largest tree stay 0: what a product with a padded slot gives
    out = (torch.empty if sizes is None else torch.zeros)(P, m, dtype=compute_dtype(vectors.dtype), device=dev)
    step = max(1, stream_rows(dev, (m + pmax) * D * 8 + m * pmax * 8))  # trees at a time
    for c0 in range(0, R, step):
        c1 = min(R, c0 + step)
        sel = order[start[c0]:start[c1 - 1] + counts[c1 - 1]]  # (Pc,) the chunk's pairs, by tree
        st = torch.as_tensor(sel, dtype=torch.int64, device=dev)
        ci = torch.as_tensor(inv[sel] - c0, dtype=torch.int64, device=dev)
        cc = torch.as_tensor(col[sel], dtype=torch.int64, device=dev)
        Ep = torch.zeros(c1 - c0, pmax, D, dtype=torch.float64, device=dev)
        Ep[ci, cc] = (vectors.gather(E[st]) if E.dim() == 1 else E[st]).double()  # (Rc, pmax, D) new vectors
        mc = m if sizes is None else int(sizes[rows[c0:c1]].max())
        trees = torch.as_tensor(rows[c0:c1], dtype=torch.int64, device=dev)
        X = vectors.gather(slot[trees, :mc]).double()  # (Rc, mc, D)
        S = torch.bmm(X, Ep.transpose(1, 2))  # (Rc, mc, pmax)
        out[st, :mc] = S[ci, :, cc].to(out.dtype)
    return out


# ------------------------------------------------------------------------------
# The knn candidate graph of big trees (:mod:`.trees`: which buckets keep it).
#
# Each slot keeps the ``k = knn`` neighbours with the best edge weights
# (:func:`~.edges.edge_weight`) and, in a last column, its next live slot in time, each with
# its cosine. The spanning forest is built on the union of these lists (an edge listed by
# either end), and the time column chains every live slot of a tree, so the forest always
# spans the tree (under a strict node cap a pair over it is no edge; :mod:`.plan` then
# joins the pieces the cap leaves).
#
# Building (:func:`build_knn_graph`), per chunk of trees: the kernels of
# :mod:`~memforest_gpu.kernels.knn` find ``k + k//2`` candidates per slot by
# ``(1 - time_weight) * cos - size_weight * tok_j / size_unit`` (the part of the weight that a
# matrix multiply can carry; exact blockwise, or in cells for trees of more than
# ``knn_cells_above`` nodes), then the candidates' cosines are recomputed in float64 and the
# ``k`` best by exact weight kept (ties: lower slot).
#
# After a round (:func:`merged_lists`, :func:`stale_entries`): a merged node's list is re-ranked
# from the union of its two parents' lists; an entry of another slot that pointed at either
# parent now points at the merged node (its cosine recomputed), the time column follows the
# live slots, and the dropped slot's list is cleared. Nothing here reads the device.
# ------------------------------------------------------------------------------

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
