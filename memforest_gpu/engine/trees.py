"""The trees of a run as padded tensors on the device: what every merge round works on.

:func:`build_trees` lays out every tree of every tenant once. Trees of similar size share a
:class:`Bucket` of B trees padded to m slots: node rows, vectors (B, m, D), the cosine
matrix (B, m, m) kept current one row/column per merge, timestamps, token counts and each
slot's span of positions. Slots are in time order inside a tree, so a slot index is a
stable tie key. :func:`~memforest_gpu.engine.apply.apply_round` updates these tensors in
place after each round; nothing here reads a value back to the host.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..kernels import size_buckets
from .partition import time_order

__all__ = ["Bucket", "TreeBatch", "build_trees", "compute_dtype", "row_sims"]


@dataclass(frozen=True)
class Bucket:
    """B trees padded to m slots. Tensors are updated in place by ``apply_round``.

    Shape: trees (B,), slot (B, m) node row (-1 = empty), X (B, m, D), W (B, m, m),
           ts (B, m) float64, tok (B, m) int64 or None, lo / hi (B, m) int64 first and last
           position of each slot's originals
    """

    trees: torch.Tensor
    trees_np: np.ndarray  # host copy of ``trees`` (known when the batch is laid out)
    slot: torch.Tensor
    X: torch.Tensor
    W: torch.Tensor
    ts: torch.Tensor
    tok: torch.Tensor | None
    lo: torch.Tensor
    hi: torch.Tensor

    @property
    def m(self) -> int:
        return int(self.slot.shape[1])


@dataclass(frozen=True)
class TreeBatch:
    """Every tree of a run with at least two nodes, in buckets by size (largest first).
    ``bucket_of`` / ``row_of`` (T,) locate tree ``t`` (-1 for one-node trees)."""

    buckets: tuple[Bucket, ...]
    bucket_of: np.ndarray
    row_of: np.ndarray


HALF = (torch.float16, torch.bfloat16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of similarities for vectors stored in ``dtype``: float32 for a half storage."""
    return torch.float32 if dtype in HALF else dtype


def _cosines(X: torch.Tensor) -> torch.Tensor:
    """(B, m, m) cosines, accumulated in float64 and made exactly symmetric, so a value never
    depends on which other trees share the batch (ties must stay ties). At most ~256 MB of
    float64 temporaries at a time. Half-precision vectors give float32 cosines."""
    B, m, _ = X.shape
    W = torch.empty(B, m, m, dtype=compute_dtype(X.dtype), device=X.device)
    step = max(1, (1 << 25) // max(1, m * m))
    for b0 in range(0, B, step):
        Xd = X[b0:b0 + step].double()
        S = Xd @ Xd.transpose(1, 2)
        W[b0:b0 + step] = ((S + S.transpose(1, 2)) * 0.5).to(X.dtype)
    return W


def build_trees(tree: torch.Tensor, tree_size: np.ndarray, embeddings: torch.Tensor, timestamps: torch.Tensor,
                codes: torch.Tensor, tokens: torch.Tensor | None, *, dtype: torch.dtype | None = None,
                chunk: int = 1 << 22) -> TreeBatch:
    """Lay out every tree of ``tree`` (global tree id per node) as padded buckets.

    ``dtype``: storage dtype of the padded vectors (default the embeddings'; float16 /
    bfloat16 halve them, similarities are still accumulated in float64). Vectors are
    gathered about ``chunk`` elements at a time, so no second padded copy is ever made.

    Shape: tree (N,), tree_size (T,) host, embeddings (N, D), timestamps (N,), codes (N,),
           tokens (N,) or None -> TreeBatch
    """
    dtype = dtype or embeddings.dtype
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
        val = slots >= 0
        s0 = slots.clamp(min=0)
        X = torch.empty(len(ids), m, embeddings.shape[1], dtype=dtype, device=dev)  # (B, m, D)
        step = max(1, chunk // max(1, m * embeddings.shape[1]))
        for c in range(0, len(ids), step):
            X[c:c + step] = (embeddings[s0[c:c + step]] * val[c:c + step, :, None]).to(dtype)
        lo = pos[s0]
        buckets.append(Bucket(trees, ids, slots, X, _cosines(X), timestamps[s0].to(torch.float64),
                              tokens[s0] if tokens is not None else None, lo, lo.clone()))
        bucket_of[ids] = b
        row_of[ids] = np.arange(len(ids))
    return TreeBatch(tuple(buckets), bucket_of, row_of)


def row_sims(X: torch.Tensor, r: np.ndarray, E: torch.Tensor, *, budget: int = 1 << 25) -> torch.Tensor:
    """Similarity of each new vector to every slot of its tree, accumulated in float64.

    Pairs of one tree share one gather of that tree (the matching schedule puts up to m/2
    pairs in a tree, so gathering per pair would cost O(m^2 D) memory per tree); trees are
    processed in chunks of at most ``budget`` float64 elements. ``r`` is a host array (the
    plan's host copy), so the grouping costs no device read.

    Shape: X (B, m, D), r (P,) host row of each pair, E (P, D) -> (P, m) in X's dtype
           (float32 for half-precision X)
    """
    P, D = E.shape
    m = X.shape[1]
    dev = X.device
    rows, inv = np.unique(np.asarray(r, dtype=np.int64), return_inverse=True)  # (R,), (P,)
    R = len(rows)
    counts = np.bincount(inv, minlength=R)
    order = np.argsort(inv, kind="stable")
    col = np.empty(P, dtype=np.int64)
    col[order] = np.arange(P) - (np.cumsum(counts) - counts)[inv[order]]
    pmax = int(counts.max()) if P else 0
    inv_t = torch.as_tensor(inv, dtype=torch.int64, device=dev)
    col_t = torch.as_tensor(col, dtype=torch.int64, device=dev)
    rows_t = torch.as_tensor(rows, dtype=torch.int64, device=dev)
    Ep = torch.zeros(R, pmax, D, dtype=torch.float64, device=dev)
    Ep[inv_t, col_t] = E.double()  # (R, pmax, D): each tree's new vectors
    out = torch.empty(P, m, dtype=compute_dtype(X.dtype), device=dev)
    step = max(1, budget // max(1, m * (D + pmax)))
    for c0 in range(0, R, step):
        S = torch.bmm(X[rows_t[c0:c0 + step]].double(), Ep[c0:c0 + step].transpose(1, 2))  # (Rc, m, pmax)
        sel = np.flatnonzero((inv >= c0) & (inv < c0 + step))
        st = torch.as_tensor(sel, dtype=torch.int64, device=dev)
        out[st] = S[inv_t[st] - c0, :, col_t[st]].to(out.dtype)
    return out
