"""One round's forest edges over the candidate graphs of every bucket (``graph="knn"``).

Every tree that plans this round contributes its edges to ONE flat edge list, with vertex
ids made global over every (bucket, row): a bucket of neighbour lists its entries (slot ->
neighbour, and slot -> next live slot), a bucket of every pair its upper triangle. Each
edge is weighted by :func:`~.edges.edge_weight` from its cosine and its ends' attributes;
one call of :func:`~memforest_gpu.kernels.forest.edge_forest` builds the spanning forest of
every tree at once; degrees and the degree-adjusted score are segment sums over it.

The candidates come back as :func:`~.plan.plan_round` consumes them: the best forest edge
per tree (``sequential``) or every forest edge (``matching``), in (bucket, tree row, tie
key) order, as the dense path orders them. On a bucket of every pair the weights, the
forest and the scores are those of the dense path bit for bit.
"""
from __future__ import annotations

import numpy as np
import torch

from ..config import CompressConfig
from ..kernels import best_edge_per_tree
from ..kernels.forest import edge_forest
from .edges import Ends, edge_weight
from .trees import Bucket, TreeBatch

__all__ = ["forest_candidates"]


def _bucket_edges(bk: Bucket, r: torch.Tensor, cfg: CompressConfig, cap: int | None):
    """Slot ends, weights and cosines of the candidate edges of rows ``r``.
    Shape: -> u, v (B', E) slots, w, cos (B', E)"""
    B, m = r.shape[0], bk.m
    dev = bk.slot.device
    e = bk.ends(r)  # (B', m)
    live = bk.slot[r] >= 0
    if bk.lists:
        v = bk.nbr[r]  # (B', m, k+1)
        c = v.shape[2]
        u = torch.arange(m, device=dev)[None, :, None].expand(B, m, c)
        cos = bk.cs[r]
        flat = v.clamp(min=0).reshape(B, -1)
        other = Ends(*(None if x is None else x.gather(1, flat).view(B, m, c) for x in e))
        me = Ends(*(None if x is None else x[:, :, None] for x in e))
        w, _ = edge_weight(cos, me, other, cfg.tree, cap)
        ok = (v >= 0) & live[:, :, None] & live.gather(1, flat).view(B, m, c)
        u, v, w, cos, ok = (x.reshape(B, -1) for x in (u, v, w, cos, ok))
    else:
        iu, ju = torch.triu_indices(m, m, 1, device=dev)
        W = bk.W[r]  # (B', m, m)
        w, _ = edge_weight(W, Ends(*(None if x is None else x[:, :, None] for x in e)),
                           Ends(*(None if x is None else x[:, None, :] for x in e)), cfg.tree, cap)
        u, v = iu.expand(B, -1), ju.expand(B, -1)
        w, cos = w[:, iu, ju], W[:, iu, ju]
        ok = live[:, iu] & live[:, ju]
    return u, v.clamp(min=0), torch.where(ok, w, torch.full_like(w, float("-inf"))), cos


def forest_candidates(batch: TreeBatch, need: np.ndarray, cfg: CompressConfig, cap: int | None,
                      matching: bool):
    """The round's candidate pairs (module docstring) as flat (C,) tensors keyed like
    :func:`~.plan.plan_round`'s, and the number of global vertices (None when no tree plans)."""
    dev = batch.vectors.device
    edges, blocks, n = [], [], 0
    for b, bk in enumerate(batch.buckets):
        rows = np.flatnonzero(need[bk.trees_np])
        if len(rows) == 0:
            continue
        r = torch.as_tensor(rows, dtype=torch.int64, device=dev)
        u, v, w, cos = _bucket_edges(bk, r, cfg, cap)
        gb = n + torch.arange(len(rows), device=dev)[:, None] * bk.m  # (B', 1) first vertex of each row
        edges.append(((gb + u).reshape(-1), (gb + v).reshape(-1), w.reshape(-1), cos.reshape(-1)))
        blocks.append((b, bk, r, n))
        n += len(rows) * bk.m
    if not blocks:
        return None, 0
    u, v, w, cos = (torch.cat(x) for x in zip(*edges))
    size = max(bk.m for _, bk, _, _ in blocks)
    vert = _vertex_tables(blocks, n, dev)
    if cap is not None and any(bk.lists for _, bk, _, _ in blocks):  # pairs over the cap are no edges
        u, v, w, cos, owner = _complete(u, v, w, cos, n, size, vert, batch, cfg, cap)
    else:
        owner = edge_forest(u, v, w, n, size=size)  # (n,) the forest edge each vertex owns, or -1
    ok = owner >= 0
    e = owner.clamp(min=0)
    a, bb = torch.minimum(u[e], v[e]), torch.maximum(u[e], v[e])  # (n,) global ends, a < bb
    one = ok.long()
    deg = torch.zeros(n, dtype=torch.int64, device=dev).scatter_add_(0, a, one).scatter_add_(0, bb, one)
    fw = w[e]
    dsum = (deg[a] + deg[bb]).to(fw.dtype)
    tree_of = vert["tree"][a]
    if cfg.tree.degree_norm == "max":
        top = torch.zeros(int(batch.bucket_of.shape[0]), dtype=dsum.dtype, device=dev)
        top = top.scatter_reduce(0, tree_of, torch.where(ok, dsum, torch.zeros_like(dsum)), "amax")
        dsum = dsum / top[tree_of].clamp(min=1)
    eta = cfg.tree.eta
    score = eta * fw - (1 - eta) * dsum  # (n,)
    sa, sb = vert["slot"][a], vert["slot"][bb]
    key = sa * vert["m"][a] + sb  # the dense path's tie key, min slot * m + max slot
    c = dict(row=vert["row"][a], a=sa, b=sb, tree=tree_of, score=score, cos=cos[e], take=ok, key=key, ga=a, gb=bb,
             na=vert["node"][a], nb=vert["node"][bb], bucket=vert["bucket"][a])
    if matching:
        order = torch.argsort(torch.where(ok, a * n + bb, torch.full_like(a, n * n)), stable=True)
        return {k: x[order] for k, x in c.items()}, n
    return _best_per_tree(c, blocks), n


def _vertex_tables(blocks, n: int, dev) -> dict:
    """Per global vertex: bucket, row in the bucket, slot, tree, node row, the bucket's m, the
    first vertex of its row, whether its bucket keeps lists, and its edge-weight attributes."""
    cols = {k: [] for k in ("bucket", "row", "slot", "tree", "node", "m", "base", "lists")}
    ends = []
    for b, bk, r, base in blocks:
        B, m = r.shape[0], bk.m
        ends.append(Ends(*(None if x is None else x.reshape(-1) for x in bk.ends(r))))
        cols["base"].append((base + torch.arange(B, device=dev) * m)[:, None].expand(B, m).reshape(-1))
        cols["lists"].append(torch.full((B * m,), bk.lists, dtype=torch.bool, device=dev))
        cols["bucket"].append(torch.full((B * m,), b, dtype=torch.int64, device=dev))
        cols["row"].append(r[:, None].expand(B, m).reshape(-1))
        cols["slot"].append(torch.arange(m, device=dev).repeat(B))
        cols["tree"].append(bk.trees[r][:, None].expand(B, m).reshape(-1))
        cols["node"].append(bk.slot[r].reshape(-1))
        cols["m"].append(torch.full((B * m,), m, dtype=torch.int64, device=dev))
    out = {k: torch.cat(x) for k, x in cols.items()}
    out["ends"] = Ends(*(None if x[0] is None else torch.cat(x) for x in zip(*ends)))
    return out


def _complete(u, v, w, cos, n: int, size: int, vert: dict, batch: TreeBatch, cfg: CompressConfig, cap: int,
              *, budget: int = 1 << 24):
    """Under a strict cap, pairs over it are no edges, so the lists can leave a tree in pieces
    that some pair that fits would join. Borůvka over the pieces: every vertex of a list
    bucket outside its tree's largest piece gets its best edge (exact weight) to another
    piece, the edges join the list, and the forest is rebuilt, until no piece joins another
    (a few host reads, only in this mode). Returns the extended edge list and the forest."""
    dev = u.device
    live = (vert["node"] >= 0) & vert["lists"]
    queried = -1
    for _ in range(max(1, (size - 1).bit_length())):
        owner, comp = edge_forest(u, v, w, n, size=size, components=True)
        csize = torch.bincount(comp[live], minlength=n)  # (n,) piece sizes at their roots
        key = csize[comp] * n + (n - 1 - comp)  # the largest piece of a row, ties to the lowest root
        top = torch.full((n,), -1, dtype=torch.int64, device=dev).scatter_reduce(
            0, vert["base"], torch.where(live, key, -1), "amax")
        q = torch.nonzero(live & (key != top[vert["base"]])).flatten()  # host read
        if q.shape[0] == 0 or q.shape[0] == queried:
            return u, v, w, cos, owner
        queried = q.shape[0]
        j = _best_outside(q, comp, live, vert, batch, cfg, cap, budget)  # (Q,) best other vertex or -1
        c = batch.vectors.dot_rows(vert["node"][q], vert["node"][j.clamp(min=0)])
        e = vert["ends"]
        wq, _ = edge_weight(c, e.at(q), e.at(j.clamp(min=0)), cfg.tree, cap)
        wq = torch.where(j >= 0, wq, torch.full_like(wq, float("-inf")))
        u, v, w, cos = torch.cat([u, q]), torch.cat([v, j.clamp(min=0)]), torch.cat([w, wq]), torch.cat([cos, c])
    return u, v, w, cos, edge_forest(u, v, w, n, size=size)


def _best_outside(q, comp, live, vert: dict, batch: TreeBatch, cfg: CompressConfig, cap: int, budget: int):
    """For each query vertex, the vertex of its row in another piece with the best edge weight
    (float32 cosines; the caller recomputes the chosen edge exactly), -1 for none.
    Shape: q (Q,) -> (Q,) global vertex ids"""
    M = int(vert["m"].max())
    vec = batch.vectors
    out = torch.full_like(q, -1)
    step = max(1, budget // max(1, M * vec.dim))
    col = torch.arange(M, device=q.device)
    for i in range(0, q.shape[0], step):
        qc = q[i:i + step]
        ids = vert["base"][qc][:, None] + col  # (Qc, M) the row's vertices
        inrow = col < vert["m"][qc][:, None]
        ids = torch.where(inrow, ids, qc[:, None])
        X = vec.gather(vert["node"][ids]).float()  # (Qc, M, D)
        s = torch.bmm(X, vec.gather(vert["node"][qc]).float()[:, :, None])[..., 0]  # (Qc, M)
        e = vert["ends"]
        wt, _ = edge_weight(s, e.at(qc[:, None]), e.at(ids), cfg.tree, cap)
        bad = ~inrow | ~live[ids] | (comp[ids] == comp[qc][:, None])
        wt = wt.masked_fill(bad, float("-inf"))
        best, arg = wt.max(1)
        out[i:i + step] = torch.where(torch.isfinite(best), ids.gather(1, arg[:, None])[:, 0], -1)
    return out


def _best_per_tree(c: dict, blocks) -> dict:
    """The best candidate of each planning tree (``sequential``), in (bucket, row) order:
    each bucket's forest edges are laid out (B', m) by owning vertex."""
    picks = []
    for _, bk, r, base in blocks:
        B, m = r.shape[0], bk.m
        blk = {k: x[base:base + B * m].view(B, m) for k, x in c.items()}
        j = best_edge_per_tree(blk["score"], blk["key"], blk["take"])  # (B',)
        jc = j.clamp(min=0)[:, None]
        pick = {k: x.gather(1, jc)[:, 0] for k, x in blk.items()}
        pick["take"] = j >= 0
        picks.append(pick)
    return {k: torch.cat([p[k] for p in picks]) for k in picks[0]}
