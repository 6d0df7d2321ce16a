"""The knn planner: candidate pairs of the trees of knn buckets, on edge lists of many
trees at once (:mod:`.trees`).

The trees that plan this round contribute their edges a block of rows at a time (at most
:data:`EDGE_BLOCK` edges, so the round's peak memory is one block's edge list): a knn bucket
its list entries (slot -> neighbour, slot -> next live slot), a dense bucket
(``knn_above = 0``) its upper triangle. Each edge is weighted by :func:`~.edges.edge_weight`
from its cosine and its ends' attributes; one call of
:func:`~memforest_gpu.kernels.edge_forest` builds the spanning forest of every tree of the
block at once; degrees and the degree-adjusted score are segment sums over it. Vertex ids
are global over every (bucket, row), for the round's one matching.

The candidates come back as the dense planner returns them: the best forest edge per tree
(``sequential``) or every forest edge (``matching``), in (bucket, tree row, tie key) order.
On a bucket of every pair the weights, the forest and the scores are the dense planner's
bit for bit.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
import torch

from ..config import CompressConfig
from ..heap import release_free_heap
from ..kernels.blocks import for_device
from ..kernels.edge_mst import edge_forest
from ..kernels.matching import best_edge_per_tree
from .candidates import Candidates, degree_adjusted
from .edges import Ends, edge_weight
from .trees import KNN, Bucket, TreeBatch

__all__ = ["knn_candidates", "Vertices", "Edges", "BlockRows"]


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
    batch: TreeBatch
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


def knn_candidates(batch: TreeBatch, need: np.ndarray, cfg: CompressConfig, cap: int | None,
                   matching: bool) -> tuple[Candidates | None, int]:
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
    release_free_heap()  # the blocks' edge lists and forests (1M nodes: ~170 MB), before the parts' concatenation
    return Candidates.cat(parts), n


def _block_candidates(blk: _Block, batch: TreeBatch, cfg: CompressConfig, cap: int | None,
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
    score = degree_adjusted(w[e], deg[a] + deg[bb], ok, row_of, B, cfg.tree)  # (n,)
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
        w, _ = edge_weight(cos, e.at(np.s_[:, :, None]), e.in_rows(v), cfg.tree, cap)
        ok = (v >= 0) & live[:, :, None] & live.gather(1, v.clamp(min=0).reshape(B, -1)).view(B, m, c)
        u, v, w, cos, ok = (x.reshape(B, -1) for x in (u, v, w, cos, ok))
    else:
        iu, ju = torch.triu_indices(m, m, 1, device=dev)
        W = bk.W[r]  # (B', m, m)
        w, _ = edge_weight(W, e.at(np.s_[:, :, None]), e.at(np.s_[:, None, :]), cfg.tree, cap)
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


def _join_pieces(edges: Edges, rows: BlockRows, *, budget: int = 1 << 24) -> tuple[Edges, torch.Tensor]:
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
        j = _best_outside(q, comp, live, rows, budget)  # (Q,) best other vertex or -1
        jc = j.clamp(min=0)
        c = rows.batch.vectors.dot_rows(vert.node[q], vert.node[jc])
        wq, _ = edge_weight(c, vert.ends.at(q), vert.ends.at(jc), rows.cfg.tree, rows.cap)
        wq = torch.where(j >= 0, wq, torch.full_like(wq, float("-inf")))
        edges = edges.cat(Edges(q, jc, wq, c))
    return edges, edges.forest(n, size)


def _best_outside(q, comp, live, rows: BlockRows, budget: int):
    """For each query vertex, the vertex of its row in another piece with the best edge weight
    (float32 cosines; the caller recomputes the chosen edge exactly), -1 for none.
    Shape: q (Q,) -> (Q,) global vertex ids"""
    vert = rows.vert
    M = int(vert.m.max())
    vec = rows.batch.vectors
    out = torch.full_like(q, -1)
    step = max(1, budget // max(1, M * vec.dim))
    col = torch.arange(M, device=q.device)
    for i in range(0, q.shape[0], step):
        qc = q[i:i + step]
        ids = vert.first[qc][:, None] + col  # (Qc, M) the row's vertices
        inrow = col < vert.m[qc][:, None]
        ids = torch.where(inrow, ids, qc[:, None])
        X = vec.gather(vert.node[ids]).float()  # (Qc, M, D)
        s = torch.bmm(X, vec.gather(vert.node[qc]).float()[:, :, None])[..., 0]  # (Qc, M)
        wt, _ = edge_weight(s, vert.ends.at(qc[:, None]), vert.ends.at(ids), rows.cfg.tree, rows.cap)
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
