"""Scoring nodes that have keys (:mod:`memforest_gpu.store.keys`), batched.

A node with keys scores ``w * cos(q, text) + (1 - w) * max_k cos(q, key_k)``, any other node
``cos(q, text)``. Since ``q`` is one vector, ``w q.t + (1 - w) q.k = q.(w t + (1 - w) k)``:
the node's score is the best of its **blended rows** ``w t + (1 - w) k``, one per key
(docs/merged-keys.md, "Search speed"). :class:`KeyedLayout` puts every tenant's rows in one
matrix: a node without keys is one row (its text's vector), a node with keys one blended row per
key, each row knowing the column of its node inside the tenant's segment. A search scores a
segment's rows in the one batched product it makes for texts alone, and takes each node's best row
with one ``scatter_reduce``: as many rows as the uncompressed store had memories (every source a
key), not texts and keys both.
"""
from __future__ import annotations

import numpy as np
import torch

from ..kernels.agpr import topk_rows
from ..store.keys import NodeKeys, ranges

__all__ = ["KeyedLayout", "node_best", "keyed_search", "node_row_table", "rescore"]


class KeyedLayout:
    """The rows of every tenant's nodes in one (R, D) matrix (see the module doc).

    ``matrix``: tenant t's rows ``[start[t], start[t] + size[t])``, its ``nodes[t]`` nodes in the
    retriever's grouped order, each node's rows side by side; ``column`` (R,): the column of each
    row's node inside its segment; ``counts`` (N,) rows per grouped node position (>= 1);
    ``plain[t]``: tenant t has no node with keys (its segment is its text vectors, ``column`` its
    row numbers); ``w``: the text weight.
    """

    def __init__(self, embeddings: torch.Tensor, keys: NodeKeys, rows: torch.Tensor, node_size: np.ndarray):
        dev = embeddings.device
        rows_np = rows.cpu().numpy()
        n_ten = len(node_size)
        tenant = np.repeat(np.arange(n_ten), node_size)  # (N,) tenant of each grouped position
        n_keys = keys.counts[rows_np]  # (N,) keys per grouped position
        self.counts = np.maximum(n_keys, 1)  # (N,) rows per node
        self.size = np.bincount(tenant, weights=self.counts, minlength=n_ten).astype(np.int64)
        self.start = np.cumsum(self.size) - self.size
        self.nodes = node_size
        self.plain = self.size == node_size
        local = np.arange(len(rows_np)) - np.repeat(np.cumsum(node_size) - node_size, node_size)  # (N,)
        first = np.cumsum(self.counts) - self.counts  # (N,) first row of each node
        t = lambda a: torch.as_tensor(a, dtype=torch.int64, device=dev)  # noqa: E731
        self.w = w = float(keys.text_weight)
        self.matrix = torch.empty(int(self.size.sum()), embeddings.shape[1], dtype=torch.float32, device=dev)
        text = embeddings[rows].float()  # (N, D)
        bare = n_keys == 0
        self.matrix[t(first[bare])] = text[t(np.flatnonzero(bare))]
        owner = np.repeat(np.arange(len(rows_np)), n_keys)  # (M,) grouped position of each key
        key_rows = np.repeat(first, n_keys) + (np.arange(len(owner)) - np.repeat(np.cumsum(n_keys) - n_keys, n_keys))
        src = ranges(keys.offsets[rows_np], n_keys)  # the store's key rows, in grouped order
        K = keys.unit(t(src).to(keys.vectors.device)).to(dev).float()  # (M, D) int8 codes decoded
        self.matrix[t(key_rows)] = w * text[t(owner)] + (1.0 - w) * K
        self.column = t(np.repeat(local, self.counts))

    def segment(self, t: int) -> tuple[torch.Tensor, int, torch.Tensor | None]:
        """Tenant ``t``'s rows, its node count, and the node column of each row (None: one row
        a node)."""
        s, e = int(self.start[t]), int(self.start[t] + self.size[t])
        return self.matrix[s:e], int(self.nodes[t]), None if self.plain[t] else self.column[s:e]


def node_best(S: torch.Tensor, column: torch.Tensor | None, n: int) -> torch.Tensor:
    """Each node's score: the best of its rows' scores (entries at -inf are ignored).

    Shape: S (Q, R) row scores, column (Q, R) or (R,) the node column of each row, or None (one
           row a node, R = n) -> (Q, n)
    """
    if column is None:
        return S[:, :n]
    col = column.expand(S.shape) if column.ndim == 1 else column
    return torch.full((S.shape[0], n), float("-inf"), device=S.device).scatter_reduce(
        1, col, S, reduce="amax", include_self=True)


def keyed_search(Qe: torch.Tensor, A: torch.Tensor, n: int, column: torch.Tensor | None, c: int, *,
                 tile_elements: int = 1 << 26):
    """:func:`~memforest_gpu.kernels.topk_search` over one tenant's segment of rows.

    Shape: Qe (Q, D), A (R, D) rows, column (R,) or None -> sims (Q, c'), index (Q, c') node
           column, c' = min(c, n); -1 / -inf past the end
    """
    Q = Qe.shape[0]
    c = min(c, n)
    vals = torch.empty(Q, c, dtype=torch.float32, device=Qe.device)
    idx = torch.empty(Q, c, dtype=torch.int64, device=Qe.device)
    step = max(1, tile_elements // max(1, A.shape[0]))
    At = A.float().T
    for q0 in range(0, Q, step):
        S = node_best(Qe[q0:q0 + step].float() @ At, column, n)  # (Qc, n)
        if c:
            vals[q0:q0 + step], idx[q0:q0 + step] = topk_rows(S, c)
    idx = torch.where(torch.isfinite(vals), idx, torch.full_like(idx, -1))
    return vals, idx


def node_row_table(counts: np.ndarray, device) -> torch.Tensor:
    """Each node's rows (in a segment whose rows follow node order), padded with -1.

    Shape: counts (n,) rows per node -> (n, max(counts)) int64
    """
    kmax = int(counts.max()) if len(counts) else 0
    start = np.cumsum(counts) - counts
    col = np.arange(kmax)[None, :]
    table = np.where(col < counts[:, None], start[:, None] + col, -1)
    return torch.as_tensor(table, dtype=torch.int64, device=device)


def rescore(Qe: torch.Tensor, cand: torch.Tensor, A: torch.Tensor, table: torch.Tensor, c: int, *,
            tile_elements: int = 1 << 24):
    """The exact score of candidate nodes (found by an index over their rows), best ``c``
    first; ties to the lower node.

    Shape: Qe (Q, D), cand (Q, C) node or -1, A (R, D) rows, table (n, kmax) rows of each node
           or -1 -> sims (Q, c'), index (Q, c'), c' = min(c, C)
    """
    Q, C = cand.shape
    kmax = table.shape[1]
    out_v = torch.full((Q, min(c, C)), float("-inf"), device=Qe.device)
    out_i = torch.full((Q, min(c, C)), -1, dtype=torch.int64, device=Qe.device)
    step = max(1, tile_elements // max(1, C * kmax * A.shape[1]))
    for q0 in range(0, Q, step):
        q = Qe[q0:q0 + step].float()  # (Qc, D)
        nd = cand[q0:q0 + step]
        ok = nd >= 0
        kr = table[nd.clamp(min=0)]  # (Qc, C, kmax)
        s = torch.einsum("qckd,qd->qck", A[kr.clamp(min=0)].float(), q).masked_fill(kr < 0, float("-inf"))
        s = s.max(2).values.masked_fill(~ok, float("-inf"))  # (Qc, C)
        key = torch.where(ok, nd, torch.full_like(nd, torch.iinfo(torch.int64).max))
        o1 = torch.argsort(key, dim=1, stable=True)
        o2 = torch.argsort(s.gather(1, o1), dim=1, descending=True, stable=True)
        o = o1.gather(1, o2)[:, :out_v.shape[1]]
        out_v[q0:q0 + step], out_i[q0:q0 + step] = s.gather(1, o), nd.gather(1, o)
    out_i = torch.where(torch.isfinite(out_v), out_i, torch.full_like(out_i, -1))
    return out_v, out_i
