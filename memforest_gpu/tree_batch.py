"""Trees of similar size in padded batches: the tensors progressive merging works on.

A :class:`TreeBatch` holds B trees padded to m slots: node ids, vectors (B, m, D), the
cosine matrix (B, m, m) kept up to date one row/column per merge, timestamps, token counts
and each slot's span of positions. The engine plans merges on these tensors
(``engine._plan_bucket``) and writes a round's merges back with :func:`apply_round`.
"""
from __future__ import annotations

import numpy as np
import torch

from .kernels import pack_segments, size_buckets
from .partition import time_order
from .store import MemoryStore

__all__ = ["TreeBatch", "make_batches", "by_batch", "pair_nodes", "mean_embeddings", "apply_round", "row_sims"]


class TreeBatch:
    """Trees of similar size in one padded batch."""

    def __init__(self, trees: torch.Tensor, slots: torch.Tensor, X: torch.Tensor, ts: torch.Tensor,
                 tok: torch.Tensor | None):
        self.trees = trees  # (B,) global tree id
        self.slot = slots  # (B, m) node id, -1 = empty
        self.X = X  # (B, m, D)
        # (B, m, m) cosine similarities, accumulated in float64 so a value never depends on the
        # batch it was computed in (other tenants' trees share the batch; ties must stay ties)
        B, m, _ = X.shape
        self.W = torch.empty(B, m, m, dtype=X.dtype, device=X.device)
        step = max(1, (1 << 25) // max(1, m * m))  # float64 temporaries of at most ~256 MB at a time
        for b0 in range(0, B, step):
            Xd = X[b0:b0 + step].double()
            W = Xd @ Xd.transpose(1, 2)
            self.W[b0:b0 + step] = ((W + W.transpose(1, 2)) * 0.5).to(X.dtype)  # exactly symmetric
        self.ts = ts  # (B, m) float64
        self.tok = tok  # (B, m) int64 or None
        self.lo = self.hi = None  # (B, m) float: first and last position of each slot's originals

    @property
    def active(self) -> torch.Tensor:
        return self.slot >= 0


def make_batches(tree: torch.Tensor, tree_size: np.ndarray, emb: torch.Tensor, store: MemoryStore,
                  tokens: list[int] | None, dev) -> list[TreeBatch]:
    n_trees = len(tree_size)
    # slots in time order inside each tree, so a slot index is a stable tie key
    order = torch.argsort(store.timestamps.to(dev), stable=True)
    index, valid, sizes = pack_segments(tree, n_trees, order=order)
    tok_all = torch.tensor(tokens, dtype=torch.int64, device=dev) if tokens is not None else None
    pos = torch.empty(len(store), dtype=emb.dtype, device=dev)  # rank by (tenant, time, index)
    pos[time_order(store.tenant_index()[1].to(dev), store.timestamps.to(dev))] = torch.arange(
        len(store), dtype=emb.dtype, device=dev)
    out = []
    for ids in size_buckets(sizes, min_size=2):
        m = int(sizes[ids].max())
        slots = index[ids][:, :m]  # (B, m)
        val = slots >= 0
        X = emb[slots.clamp(min=0)] * val[:, :, None]  # (B, m, D)
        ts = store.timestamps.to(dev)[slots.clamp(min=0)]
        tok = tok_all[slots.clamp(min=0)] if tok_all is not None else None
        bk = TreeBatch(ids, slots, X, ts, tok)
        bk.lo = pos[slots.clamp(min=0)]
        bk.hi = bk.lo.clone()
        bk.trees_np = ids.cpu().numpy()
        out.append(bk)
    return out


def by_batch(plan) -> dict[int, tuple]:
    """Plan entries grouped by bucket: id -> (bucket, positions in plan, rows, slots a, slots b)."""
    out: dict[int, tuple] = {}
    for j, (bk, r, sa, sb, _w) in enumerate(plan):
        g = out.setdefault(id(bk), (bk, [], [], [], []))
        g[1].append(j), g[2].append(r), g[3].append(sa), g[4].append(sb)
    return out


def pair_nodes(plan) -> list[tuple[int, int]]:
    """Node ids (a, b) of every planned pair, in plan order."""
    ends: list = [None] * len(plan)
    for bk, js, rs, sas, sbs in by_batch(plan).values():
        slot = bk.slot.cpu().numpy()
        a, b = slot[rs, sas].tolist(), slot[rs, sbs].tolist()
        for j, x, y in zip(js, a, b):
            ends[j] = (x, y)
    return ends


def mean_embeddings(plan) -> torch.Tensor:
    """Normalised mean of each pair's two vectors (no embedder). Shape: -> (P, D)"""
    bk0 = plan[0][0]
    out = torch.empty(len(plan), bk0.X.shape[2], dtype=bk0.X.dtype, device=bk0.X.device)
    for bk, js, rs, sas, sbs in by_batch(plan).values():
        dev = bk.X.device
        r, sa, sb = (torch.as_tensor(c, dtype=torch.int64, device=dev) for c in (rs, sas, sbs))
        out[torch.as_tensor(js, dtype=torch.int64, device=dev)] = bk.X[r, sa] + bk.X[r, sb]
    return torch.nn.functional.normalize(out, dim=1)


def apply_round(plan, new_nodes: list[int], new_emb: torch.Tensor, nodes):
    """Write a round's merges into the bucket tensors, one scatter per bucket: the merged
    node takes the lower slot, the other slot empties, and the similarity row/column
    of the merged node is recomputed against its tree."""
    for bk, js, rs, sas, sbs in by_batch(plan).values():
        dev = bk.X.device
        j, r, sa, sb = (torch.as_tensor(c, dtype=torch.int64, device=dev) for c in (js, rs, sas, sbs))
        keep, drop = torch.minimum(sa, sb), torch.maximum(sa, sb)
        new_ids = [new_nodes[i] for i in js]
        new = torch.as_tensor(new_ids, dtype=torch.int64, device=dev)
        E = new_emb[j].to(bk.X.dtype)  # (P, D)
        bk.slot[r, keep] = new
        bk.slot[r, drop] = -1
        bk.X[r, keep] = E
        bk.X[r, drop] = 0
        sims = row_sims(bk.X, r, E)  # (P, m), after all writes
        bk.W[r, keep, :] = sims
        bk.W[r, :, keep] = sims
        bk.ts[r, keep] = torch.as_tensor([nodes.ts[i] for i in new_ids], dtype=bk.ts.dtype, device=dev)
        bk.lo[r, keep] = torch.minimum(bk.lo[r, keep], bk.lo[r, drop])
        bk.hi[r, keep] = torch.maximum(bk.hi[r, keep], bk.hi[r, drop])
        if bk.tok is not None and nodes.tokens is not None:
            bk.tok[r, keep] = torch.as_tensor([nodes.tokens[i] for i in new_ids], dtype=torch.int64,
                                              device=dev)


def row_sims(X: torch.Tensor, r: torch.Tensor, E: torch.Tensor, *, budget: int = 1 << 25) -> torch.Tensor:
    """Similarity of each new vector to every slot of its tree, accumulated in float64.

    Pairs of one tree share one gather of that tree (the matching schedule puts up to m/2
    pairs in a tree, so gathering per pair would cost O(m^2 D) memory per tree); trees are
    processed in chunks of at most ``budget`` float64 elements.

    Shape: X (B, m, D), r (P,) row of each pair, E (P, D) -> (P, m) in X's dtype
    """
    P, D = E.shape
    m = X.shape[1]
    rows, inv = torch.unique(r, return_inverse=True)  # (R,), (P,)
    R = rows.shape[0]
    counts = torch.bincount(inv, minlength=R)
    order = torch.argsort(inv, stable=True)
    col = torch.empty_like(inv)
    col[order] = torch.arange(P, device=r.device) - (torch.cumsum(counts, 0) - counts)[inv[order]]
    pmax = int(counts.max())
    Ep = torch.zeros(R, pmax, D, dtype=torch.float64, device=E.device)
    Ep[inv, col] = E.double()  # (R, pmax, D): each tree's new vectors
    out = torch.empty(P, m, dtype=X.dtype, device=X.device)
    step = max(1, budget // max(1, m * (D + pmax)))
    for c0 in range(0, R, step):
        S = torch.bmm(X[rows[c0:c0 + step]].double(), Ep[c0:c0 + step].transpose(1, 2))  # (Rc, m, pmax)
        sel = (inv >= c0) & (inv < c0 + step)
        out[sel] = S[inv[sel] - c0, :, col[sel]].to(X.dtype)
    return out
