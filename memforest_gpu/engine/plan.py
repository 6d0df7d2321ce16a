"""One round's choice of pairs, for every tree of every tenant at once (docs/method.md
sections 2-3).

Edge weights (:func:`~.edges.edge_weight`: the cosine, optionally with the time and size
terms and the node-token cap) -> spanning forest -> degree-adjusted score
``w' = eta*w - (1-eta)*(deg_i+deg_j)`` -> :class:`Candidates`: the best edge of each tree
(``sequential``) or every forest edge (``matching``, then ONE greedy matching over the
candidates of every bucket). The dense planner (:func:`dense_candidates`: one padded
(B', m, m) matrix per bucket) and the knn planner (:func:`knn_candidates`: edge lists of
many trees at once) make the candidates of their buckets (:mod:`.trees` says which).

The chosen pairs are copied to the host once: :class:`Plan` holds both the device tensors
(for ``apply_round``) and their host copy (for the merger's texts and the bookkeeping). One
device->host read per round (the pairs, padded to the most a round can take), plus one per 8
matching iterations (and, on edge lists of a million edges or more, one per compaction of the
forest); none per tree, pair or tenant.

Read top to bottom: :func:`plan_round` and :class:`Plan`; the candidates and their score
(:class:`Candidates`, :func:`degree_adjusted`); the dense planner; the knn planner.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from ..config import CompressConfig, SpanningConfig
from ..kernels.blocks import for_device
from ..kernels.edge_mst import edge_forest
from ..kernels.matching import best_edge_per_tree, greedy_matching
from ..kernels.mst import edge_key, spanning_degrees, spanning_forest
from .edges import Ends, edge_weight
from .memory import MemoryPlan
from .trees import KNN, Bucket, BucketLayout, knn_planned

__all__ = ["Plan", "plan_round", "Candidates", "degree_adjusted", "dense_candidates", "DENSE_EDGE_BLOCK",
           "knn_candidates", "Vertices", "Edges", "BlockRows"]


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


def plan_round(batch: BucketLayout, need: np.ndarray, remaining: np.ndarray, cfg: CompressConfig,
               cap: int | None = None, rng: np.random.Generator | None = None, *,
               memory: MemoryPlan | None = None) -> Plan:
    """The pairs every tree in ``need`` merges this round.

    ``need`` (T,) host bool: trees that still have to lose nodes; ``remaining`` (T,) host:
    how many (the matching schedule takes at most that many pairs in a tree). A tree in
    ``need`` with no pair in the plan has no eligible edge left (node cap). ``memory``: the
    run's :class:`~.memory.MemoryPlan` (the knn planner hands its blocks' pages back; ``None``:
    kept).
    """
    dev = batch.vectors.device
    matching = cfg.merge.schedule == "matching"
    c, n_vertices = _candidates(batch, need, cfg, cap, rng, matching, memory)
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


def _candidates(batch: BucketLayout, need: np.ndarray, cfg: CompressConfig, cap: int | None, rng,
                matching: bool, memory: MemoryPlan | None) -> tuple[Candidates | None, int]:
    """The round's candidates of every tree in ``need``, the knn planner's first, and the
    number of matching vertices. A tree's candidates depend on its own edges only and both
    planners make the same plan on the same edges (tests/test_knn_graph.py), so the split
    changes no merge."""
    by_knn = np.zeros(len(need), dtype=bool)  # (T,) trees the knn planner plans
    for bk in batch.buckets:
        by_knn[bk.trees_np] = knn_planned(bk.graph, cfg.spanning)
    parts, n = [], 0
    if (need & by_knn).any():
        c, n = knn_candidates(batch, need & by_knn, cfg, cap, matching, memory)
        parts += [c] if c is not None else []
    if (need & ~by_knn).any():
        c, n_dense = dense_candidates(batch, need & ~by_knn, cfg, cap, rng, matching)
        if c is not None:
            parts.append(c.with_vertex_offset(n) if matching else c)  # the dense planner's vertices after the knn's
            n += n_dense
    if not parts:
        return None, 0
    return Candidates.cat(parts), n


# ------------------------------------------------------------------------------
# The candidate pairs of a round, as both planners hand them to :func:`~.plan.plan_round`,
# and the degree-adjusted score they are ranked by (docs/method.md section 2).
#
# A candidate is a spanning-forest edge of a tree that plans this round: under ``sequential``
# the best edge of each tree, under ``matching`` every forest edge (the round's greedy
# matching then picks among them). The dense planner (:mod:`.plan`) and the knn
# planner (:mod:`.plan`) both return :class:`Candidates`; the plan concatenates them.
# ------------------------------------------------------------------------------

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
                    n_trees: int, spanning: SpanningConfig) -> torch.Tensor:
    """The score of each forest edge: ``w' = eta * w - (1 - eta) * (deg_i + deg_j)``, with
    ``degree_norm="max"`` dividing ``deg_i + deg_j`` by its largest value over the eligible
    edges of the edge's tree (at least 1).

    Shape: w, deg_sum, eligible, tree_of (E,) (tree_of: each edge's tree in [0, n_trees)) ->
           (E,) in w's dtype
    """
    dsum = deg_sum.to(w.dtype)
    if spanning.degree_norm == "max":
        top = torch.zeros(n_trees, dtype=dsum.dtype, device=dsum.device)
        top = top.scatter_reduce(0, tree_of, torch.where(eligible, dsum, torch.zeros_like(dsum)), "amax")
        dsum = dsum / top[tree_of].clamp(min=1)
    eta = spanning.eta
    return eta * w - (1 - eta) * dsum


# ------------------------------------------------------------------------------
# The dense planner: candidate pairs of the trees of dense buckets, one padded (B', m, m)
# matrix per bucket (:mod:`.trees`).
#
# Per bucket: edge weights (:func:`~.edges.edge_weight` on the cosine matrix) -> the spanning
# forest of every tree at once (:func:`~memforest_gpu.kernels.spanning_forest`) -> tree degrees
# -> degree-adjusted scores (:func:`~.plan.degree_adjusted`) -> the best edge of each
# tree (``sequential``) or every forest edge (``matching``). A bucket of big trees is scored in
# slices of trees so that the (B', m, m) temporaries stay bounded.
# ------------------------------------------------------------------------------

#: most (tree, slot, slot) elements scored at a time, per device: the edge terms make a few
#: (B', m, m) int64 / float temporaries (the bucket's cosines gathered, the weights, the merged
#: lengths), so a bucket of big trees is scored in slices of trees (CPU: 8M elements, ~64 MB a
#: float64 temporary; 32M held ~600 MB at once, the paper preset's peak at 1M nodes)
DENSE_EDGE_BLOCK = {"cpu": 1 << 23, "cuda": 1 << 25}


def dense_candidates(batch: BucketLayout, need: np.ndarray, cfg: CompressConfig, cap: int | None, rng,
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
                          tile_elements: int | None = None) -> _ScoredForest:
    """:func:`_scored_forest` over slices of at most ``tile_elements // m**2`` trees, concatenated.
    Trees are independent (and the random ablation draws its (B', m, m) weights in row-major
    order), so the result is the same as one call; only the temporaries are bounded."""
    tile_elements = tile_elements or for_device(DENSE_EDGE_BLOCK, bk.slot.device)
    step = max(1, tile_elements // max(1, bk.m * bk.m))
    if r.shape[0] <= step:
        return _scored_forest(bk, r, cfg, cap, rng)
    parts = [_scored_forest(bk, r[i:i + step], cfg, cap, rng) for i in range(0, r.shape[0], step)]
    return _ScoredForest(*(torch.cat(x) for x in zip(*parts)))


def _scored_forest(bk: Bucket, r: torch.Tensor, cfg: CompressConfig, cap: int | None, rng) -> _ScoredForest:
    """The spanning forest of the rows ``r`` with its edges' degree-adjusted scores."""
    Wt, W, est = _edge_weights(bk, r, cfg, cap, rng)  # edge weights, cosines (Bucket.W), est. merged lengths
    B, m, _ = W.shape
    u, v, w, ok = spanning_forest(Wt, bk.slot[r] >= 0, maximum=(cfg.spanning.kind != "min"))
    deg = spanning_degrees(u, v, ok, m)  # (B', m)
    E = u.shape[1]  # edges per tree (padded)
    tree_of = torch.arange(B, device=W.device)[:, None].expand(B, E)
    score = degree_adjusted(w.reshape(-1), (deg.gather(1, u) + deg.gather(1, v)).reshape(-1), ok.reshape(-1),
                            tree_of.reshape(-1), B, cfg.spanning).view(B, E)
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
    if cfg.spanning.kind == "random":  # ablation: a random spanning tree, random merge order
        Rw = torch.from_numpy(rng.random((B, m, m))).to(W.device, W.dtype)
        cos = torch.triu(Rw, 1) + torch.triu(Rw, 1).transpose(1, 2)
    e = bk.ends(r)  # (B', m)
    Wt, est = edge_weight(cos, e.at(np.s_[:, :, None]), e.at(np.s_[:, None, :]), cfg.spanning, cap)
    return Wt, W, est


# ------------------------------------------------------------------------------
# The knn planner: candidate pairs of the trees of knn buckets, on edge lists of many
# trees at once (:mod:`.trees`).
#
# The trees that plan this round contribute their edges a block of rows at a time (at most
# :data:`EDGE_BLOCK` edges, so the round's peak memory is one block's edge list): a knn bucket
# its list entries (slot -> neighbour, slot -> next live slot), a dense bucket
# (``knn_above = 0``) its upper triangle. Each edge is weighted by :func:`~.edges.edge_weight`
# from its cosine and its ends' attributes; one call of
# :func:`~memforest_gpu.kernels.edge_forest` builds the spanning forest of every tree of the
# block at once; degrees and the degree-adjusted score are segment sums over it. Vertex ids
# are global over every (bucket, row), for the round's one matching.
#
# The candidates come back as the dense planner returns them: the best forest edge per tree
# (``sequential``) or every forest edge (``matching``), in (bucket, tree row, tie key) order.
# On a bucket of every pair the weights, the forest and the scores are the dense planner's
# bit for bit.
# ------------------------------------------------------------------------------

class Vertices(NamedTuple):
    """The round's global vertices (one per slot of every planning row), in (bucket, row,
    slot) order. Shape: every field (n,): ``bucket``, ``row`` (in the bucket), ``slot``,
    ``tree``, ``node`` (node row, -1 for an empty slot), ``m`` (the bucket's slots),
    ``first`` (the first vertex of its row), ``knn`` (bool: its bucket keeps the knn graph),
    ``ends`` (its edge-weight attributes)."""

    bucket: torch.Tensor
    row: torch.Tensor
    slot: torch.Tensor
    tree: torch.Tensor
    node: torch.Tensor
    m: torch.Tensor
    first: torch.Tensor
    knn: torch.Tensor
    ends: Ends


class Edges(NamedTuple):
    """A block's candidate edges, flat over its rows. Shape: every field (E,): ``u``, ``v``
    (vertex ends), ``w`` (edge weight, -inf: no edge), ``cos`` (the ends' cosine)."""

    u: torch.Tensor
    v: torch.Tensor
    w: torch.Tensor
    cos: torch.Tensor

    def cat(self, more: Edges) -> Edges:
        """These edges followed by ``more``."""
        return Edges(*(torch.cat([a, b]) for a, b in zip(self, more)))

    def forest(self, n: int, size: int, **kw):
        """:func:`~memforest_gpu.kernels.edge_forest` of these edges over ``n`` vertices in rows
        of ``size``."""
        return edge_forest(self.u, self.v, self.w, n, size=size, **kw)


class BlockRows(NamedTuple):
    """What joining a block's pieces reads: its vertices ``vert`` (rows of ``size`` slots), the
    round's ``batch`` (the vectors), ``cfg`` and the node ``cap`` (edge weights)."""

    vert: Vertices
    size: int
    batch: BucketLayout
    cfg: CompressConfig
    cap: int


class _Block(NamedTuple):
    """The rows ``r`` of bucket ``b`` that plan this round; their vertices start at ``first``."""

    b: int
    bk: Bucket
    r: torch.Tensor
    first: int


#: edges of one block of the knn planner (a bucket's rows are planned a block at a time, so the
#: round's peak memory is one block's edge list and its sort, not every tree's at once)
EDGE_BLOCK = {"cpu": 1 << 20, "cuda": 1 << 24}


def knn_candidates(batch: BucketLayout, need: np.ndarray, cfg: CompressConfig, cap: int | None,
                   matching: bool, memory: MemoryPlan | None = None) -> tuple[Candidates | None, int]:
    """The candidate pairs of every tree in ``need`` (module docstring), and the number of
    global vertices (``None``, 0 when no tree plans). Trees are planned a block of rows at a
    time (:data:`EDGE_BLOCK` edges); a tree's plan depends on its own edges only."""
    dev = batch.vectors.device
    parts, n = [], 0
    per_block = for_device(EDGE_BLOCK, dev)
    for b, bk in enumerate(batch.buckets):
        rows = np.flatnonzero(need[bk.trees_np])
        if len(rows) == 0:
            continue
        per_row = bk.m * (bk.nbr.shape[2] if bk.graph == KNN else max(1, (bk.m - 1) // 2))
        step = max(1, per_block // max(1, per_row))
        for i in range(0, len(rows), step):
            r = torch.as_tensor(rows[i:i + step], dtype=torch.int64, device=dev)
            parts.append(_block_candidates(_Block(b, bk, r, n), batch, cfg, cap, matching))
            n += r.shape[0] * bk.m
    if not parts:
        return None, 0
    if memory is not None:
        memory.release()  # the blocks' edge lists and forests (1M nodes: ~170 MB), before the parts' concatenation
    return Candidates.cat(parts), n


def _block_candidates(blk: _Block, batch: BucketLayout, cfg: CompressConfig, cap: int | None,
                      matching: bool) -> Candidates:
    """The candidates of one block's trees, with vertex ids offset by ``blk.first``."""
    dev = batch.vectors.device
    B, m = blk.r.shape[0], blk.bk.m
    n = B * m
    local = _Block(blk.b, blk.bk, blk.r, 0)
    u, v, w, cos = _bucket_edges(blk.bk, blk.r, cfg, cap)
    first = torch.arange(B, device=dev)[:, None] * m  # (B', 1) first vertex of each row
    edges = Edges((first + u).reshape(-1), (first + v).reshape(-1), w.reshape(-1), cos.reshape(-1))
    vert = _vertices([local], dev)
    if cap is not None and blk.bk.graph == KNN:  # pairs over the cap are no edges
        edges, owner = _join_pieces(edges, BlockRows(vert, m, batch, cfg, cap))
    else:
        owner = edges.forest(n, m)  # (n,) the forest edge each vertex owns, or -1
    u, v, w, cos = edges
    ok = owner >= 0
    e = owner.clamp(min=0)
    a, bb = torch.minimum(u[e], v[e]), torch.maximum(u[e], v[e])  # (n,) ends, a < bb
    one = ok.long()
    deg = torch.zeros(n, dtype=torch.int64, device=dev).scatter_add_(0, a, one).scatter_add_(0, bb, one)
    row_of = a // m  # each edge's tree, as its row of the block
    score = degree_adjusted(w[e], deg[a] + deg[bb], ok, row_of, B, cfg.spanning)  # (n,)
    sa, sb = vert.slot[a], vert.slot[bb]
    c = Candidates(bucket=vert.bucket[a], row=vert.row[a], tree=vert.tree[a], slot_a=sa, slot_b=sb,
                   node_a=vert.node[a], node_b=vert.node[bb], score=score, similarity=cos[e], eligible=ok,
                   tie_key=sa * m + sb, vertex_a=a + blk.first, vertex_b=bb + blk.first)  # the dense planner's key
    if matching:
        return c.take(torch.argsort(torch.where(ok, a * n + bb, torch.full_like(a, n * n)), stable=True))
    return _best_per_tree(c, [local])


def _bucket_edges(bk: Bucket, r: torch.Tensor, cfg: CompressConfig, cap: int | None):
    """Slot ends, weights and cosines of the candidate edges of rows ``r``.
    Shape: -> u, v (B', E) slots, w, cos (B', E)"""
    B, m = r.shape[0], bk.m
    dev = bk.slot.device
    e = bk.ends(r)  # (B', m)
    live = bk.slot[r] >= 0
    if bk.graph == KNN:
        v = bk.nbr[r].long()  # (B', m, k+1)
        c = v.shape[2]
        u = torch.arange(m, device=dev)[None, :, None].expand(B, m, c)
        cos = bk.cs[r]
        w, _ = edge_weight(cos, e.at(np.s_[:, :, None]), e.in_rows(v), cfg.spanning, cap)
        ok = (v >= 0) & live[:, :, None] & live.gather(1, v.clamp(min=0).reshape(B, -1)).view(B, m, c)
        u, v, w, cos, ok = (x.reshape(B, -1) for x in (u, v, w, cos, ok))
    else:
        iu, ju = torch.triu_indices(m, m, 1, device=dev)
        W = bk.W[r]  # (B', m, m)
        w, _ = edge_weight(W, e.at(np.s_[:, :, None]), e.at(np.s_[:, None, :]), cfg.spanning, cap)
        u, v = iu.expand(B, -1), ju.expand(B, -1)
        w, cos = w[:, iu, ju], W[:, iu, ju]
        ok = live[:, iu] & live[:, ju]
    return u, v.clamp(min=0), torch.where(ok, w, torch.full_like(w, float("-inf"))), cos


def _vertices(blocks: list[_Block], dev) -> Vertices:
    """The :class:`Vertices` of every planning row of ``blocks``."""
    cols = {k: [] for k in Vertices._fields if k != "ends"}
    ends = []
    for b, bk, r, first in blocks:
        B, m = r.shape[0], bk.m
        ends.append(bk.ends(r).map(lambda x: x.reshape(-1)))
        cols["first"].append((first + torch.arange(B, device=dev) * m)[:, None].expand(B, m).reshape(-1))
        cols["knn"].append(torch.full((B * m,), bk.graph == KNN, dtype=torch.bool, device=dev))
        cols["bucket"].append(torch.full((B * m,), b, dtype=torch.int64, device=dev))
        cols["row"].append(r[:, None].expand(B, m).reshape(-1))
        cols["slot"].append(torch.arange(m, device=dev).repeat(B))
        cols["tree"].append(bk.trees[r][:, None].expand(B, m).reshape(-1))
        cols["node"].append(bk.slot[r].reshape(-1))
        cols["m"].append(torch.full((B * m,), m, dtype=torch.int64, device=dev))
    return Vertices(**{k: torch.cat(x) for k, x in cols.items()}, ends=Ends.cat(ends))


def _join_pieces(edges: Edges, rows: BlockRows, *, tile_elements: int = 1 << 24) -> tuple[Edges, torch.Tensor]:
    """Under a strict cap, pairs over it are no edges, so the lists can leave a tree in pieces
    that some pair that fits would join. Borůvka over the pieces: every vertex of a knn
    bucket outside its tree's largest piece gets its best edge (exact weight) to another
    piece, the edges join the list, and the forest is rebuilt, until no piece joins another
    (a few host reads, only in this mode). Returns the extended edge list and the forest."""
    vert, size = rows.vert, rows.size
    n = vert.node.shape[0]
    dev = edges.u.device
    live = (vert.node >= 0) & vert.knn
    queried = -1
    for _ in range(max(1, (size - 1).bit_length())):
        owner, comp = edges.forest(n, size, components=True)
        csize = torch.bincount(comp[live], minlength=n)  # (n,) piece sizes at their roots
        key = csize[comp] * n + (n - 1 - comp)  # the largest piece of a row, ties to the lowest root
        top = torch.full((n,), -1, dtype=torch.int64, device=dev).scatter_reduce(
            0, vert.first, torch.where(live, key, -1), "amax")
        q = torch.nonzero(live & (key != top[vert.first])).flatten()  # host read
        if q.shape[0] == 0 or q.shape[0] == queried:
            return edges, owner
        queried = q.shape[0]
        j = _best_outside(q, comp, live, rows, tile_elements)  # (Q,) best other vertex or -1
        jc = j.clamp(min=0)
        c = rows.batch.vectors.dot_rows(vert.node[q], vert.node[jc])
        wq, _ = edge_weight(c, vert.ends.at(q), vert.ends.at(jc), rows.cfg.spanning, rows.cap)
        wq = torch.where(j >= 0, wq, torch.full_like(wq, float("-inf")))
        edges = edges.cat(Edges(q, jc, wq, c))
    return edges, edges.forest(n, size)


def _best_outside(q, comp, live, rows: BlockRows, tile_elements: int):
    """For each query vertex, the vertex of its row in another piece with the best edge weight
    (float32 cosines; the caller recomputes the chosen edge exactly), -1 for none.
    Shape: q (Q,) -> (Q,) global vertex ids"""
    vert = rows.vert
    M = int(vert.m.max())
    vec = rows.batch.vectors
    out = torch.full_like(q, -1)
    step = max(1, tile_elements // max(1, M * vec.dim))
    col = torch.arange(M, device=q.device)
    for i in range(0, q.shape[0], step):
        qc = q[i:i + step]
        ids = vert.first[qc][:, None] + col  # (Qc, M) the row's vertices
        inrow = col < vert.m[qc][:, None]
        ids = torch.where(inrow, ids, qc[:, None])
        X = vec.gather(vert.node[ids]).float()  # (Qc, M, D)
        s = torch.bmm(X, vec.gather(vert.node[qc]).float()[:, :, None])[..., 0]  # (Qc, M)
        wt, _ = edge_weight(s, vert.ends.at(qc[:, None]), vert.ends.at(ids), rows.cfg.spanning, rows.cap)
        bad = ~inrow | ~live[ids] | (comp[ids] == comp[qc][:, None])
        wt = wt.masked_fill(bad, float("-inf"))
        best, arg = wt.max(1)
        out[i:i + step] = torch.where(torch.isfinite(best), ids.gather(1, arg[:, None])[:, 0], -1)
    return out


def _best_per_tree(c: Candidates, blocks: list[_Block]) -> Candidates:
    """The best candidate of each planning tree (``sequential``), in (bucket, row) order:
    each bucket's forest edges are laid out (B', m) by owning vertex."""
    picks = []
    for blk in blocks:
        B, m = blk.r.shape[0], blk.bk.m
        block = c.take(slice(blk.first, blk.first + B * m)).map(lambda x: x.view(B, m))
        j = best_edge_per_tree(block.score, block.tie_key, block.eligible)  # (B',)
        jc = j.clamp(min=0)[:, None]
        pick = block.map(lambda x: x.gather(1, jc)[:, 0])
        picks.append(dataclasses.replace(pick, eligible=j >= 0))
    return Candidates.cat(picks)
