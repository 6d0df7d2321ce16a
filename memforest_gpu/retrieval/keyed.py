"""Scoring nodes that have keys (:mod:`memforest_gpu.store.keys`), batched.

A node with keys scores ``w * cos(q, text) + (1 - w) * max_k cos(q, key_k)``, any other node
``cos(q, text)``. :class:`KeyedLayout` puts every tenant's nodes and keys in one matrix, the
tenant's segment being its nodes (in the retriever's grouped order) followed by its keys, each
row knowing the column of its node inside the segment. A search then scores a segment's nodes
and keys in the one batched product it makes for the nodes alone, and takes each node's best
key with one ``scatter_reduce``: no loop over nodes, and no second gather.
"""
from __future__ import annotations

import numpy as np
import torch

from ..kernels import topk_rows
from ..store.keys import NodeKeys, ranges

__all__ = ["KeyedLayout", "blend", "keyed_search", "node_key_table", "rescore"]


class KeyedLayout:
    """Nodes and keys of every tenant in one (N + M, D) matrix.

    ``matrix``: tenant t's rows ``[start[t], start[t] + size[t])`` hold its ``nodes[t]`` nodes
    (grouped order) then its keys; ``column`` (N + M,): the column of each row's node inside its
    segment (a node row: its own); ``is_key`` (N + M,); ``has`` (N,) over grouped node positions;
    ``node_rows`` (N,): the matrix row of each grouped node position; ``w``: the text weight.
    """

    def __init__(self, embeddings: torch.Tensor, keys: NodeKeys, rows: torch.Tensor, node_size: np.ndarray):
        dev = embeddings.device
        rows_np = rows.cpu().numpy()
        n_ten = len(node_size)
        tenant = np.repeat(np.arange(n_ten), node_size)  # (N,) tenant of each grouped position
        counts = keys.counts[rows_np]  # (N,) keys per grouped position
        key_size = np.bincount(np.repeat(tenant, counts), minlength=n_ten).astype(np.int64)
        self.size = node_size + key_size
        self.start = np.cumsum(self.size) - self.size
        self.nodes = node_size
        local = np.arange(len(rows_np)) - np.repeat(np.cumsum(node_size) - node_size, node_size)  # (N,)
        self.node_rows = self.start[tenant] + local
        key_tenant = np.repeat(tenant, counts)
        key_local = np.arange(len(key_tenant)) - np.repeat(np.cumsum(key_size) - key_size, key_size)
        key_rows = self.start[key_tenant] + node_size[key_tenant] + key_local
        total = int(self.size.sum())
        t = lambda a: torch.as_tensor(a, dtype=torch.int64, device=dev)  # noqa: E731
        self.matrix = torch.empty(total, embeddings.shape[1], dtype=torch.float32, device=dev)
        self.matrix[t(self.node_rows)] = embeddings[rows].float()
        src = ranges(keys.offsets[rows_np], counts)  # key rows of the store's keys, in grouped order
        self.matrix[t(key_rows)] = keys.unit(t(src).to(keys.vectors.device)).to(dev)  # int8 codes decoded
        column = np.empty(total, dtype=np.int64)
        column[self.node_rows] = local
        column[key_rows] = np.repeat(local, counts)
        self.column = t(column)
        is_key = np.zeros(total, dtype=bool)
        is_key[key_rows] = True
        self.is_key = torch.as_tensor(is_key, device=dev)
        self.has = torch.as_tensor(counts > 0, device=dev)
        self.w = float(keys.text_weight)

    def segment(self, t: int) -> tuple[torch.Tensor, int, torch.Tensor]:
        """Tenant ``t``'s rows, its node count, and the node column of each row."""
        s, e = int(self.start[t]), int(self.start[t] + self.size[t])
        return self.matrix[s:e], int(self.nodes[t]), self.column[s:e]


def blend(S: torch.Tensor, Sk: torch.Tensor, column: torch.Tensor, has: torch.Tensor, w: float) -> torch.Tensor:
    """Node scores from the text cosines and the cosines of keys (or of any rows: entries of
    ``Sk`` at -inf are ignored).

    Shape: S (Q, n) text cosines, Sk (Q, m), column (Q, m) or (m,) the node column of each entry,
           has (Q, n) or (n,) bool -> (Q, n)
    """
    col = column.expand(Sk.shape) if column.ndim == 1 else column
    best = torch.full_like(S, float("-inf")).scatter_reduce(1, col, Sk, reduce="amax", include_self=True)
    return torch.where(has, w * S + (1.0 - w) * best, S)


def keyed_search(Qe: torch.Tensor, A: torch.Tensor, n: int, column: torch.Tensor, has: torch.Tensor, w: float,
                 c: int, *, budget: int = 1 << 26):
    """:func:`~memforest_gpu.kernels.topk_search` over one tenant's segment of nodes and keys.

    Shape: Qe (Q, D), A (n + m, D) nodes then keys, column (n + m,), has (n,) -> sims (Q, c'),
           index (Q, c') node column, c' = min(c, n); -1 / -inf past the end
    """
    Q = Qe.shape[0]
    c = min(c, n)
    vals = torch.empty(Q, c, dtype=torch.float32, device=Qe.device)
    idx = torch.empty(Q, c, dtype=torch.int64, device=Qe.device)
    step = max(1, budget // max(1, A.shape[0]))
    At = A.float().T
    for q0 in range(0, Q, step):
        Sa = Qe[q0:q0 + step].float() @ At  # (Qc, n + m)
        S = blend(Sa[:, :n], Sa[:, n:], column[n:], has, w)  # (Qc, n)
        if c:
            vals[q0:q0 + step], idx[q0:q0 + step] = topk_rows(S, c)
    idx = torch.where(torch.isfinite(vals), idx, torch.full_like(idx, -1))
    return vals, idx


def node_key_table(counts: np.ndarray, device) -> torch.Tensor:
    """Each node's key rows (in a segment whose keys follow node order), padded with -1.

    Shape: counts (N,) -> (N, max(counts)) int64
    """
    kmax = int(counts.max()) if len(counts) else 0
    start = np.cumsum(counts) - counts
    col = np.arange(kmax)[None, :]
    table = np.where(col < counts[:, None], start[:, None] + col, -1)
    return torch.as_tensor(table, dtype=torch.int64, device=device)


def rescore(Qe: torch.Tensor, cand: torch.Tensor, X: torch.Tensor, K: torch.Tensor, table: torch.Tensor,
            has: torch.Tensor, w: float, c: int, *, budget: int = 1 << 24):
    """The exact rule's score of candidate nodes (found by an index over texts and keys), best
    ``c`` first; ties to the lower node.

    Shape: Qe (Q, D), cand (Q, C) node or -1, X (N, D), K (M, D), table (N, kmax) key rows or -1,
           has (N,) -> sims (Q, c'), index (Q, c'), c' = min(c, C)
    """
    Q, C = cand.shape
    kmax = table.shape[1]
    out_v = torch.full((Q, min(c, C)), float("-inf"), device=Qe.device)
    out_i = torch.full((Q, min(c, C)), -1, dtype=torch.int64, device=Qe.device)
    step = max(1, budget // max(1, C * (1 + kmax) * X.shape[1]))
    for q0 in range(0, Q, step):
        q = Qe[q0:q0 + step].float()  # (Qc, D)
        nd = cand[q0:q0 + step]
        ok = nd >= 0
        n0 = nd.clamp(min=0)
        s = torch.einsum("qcd,qd->qc", X[n0].float(), q)  # (Qc, C)
        if kmax:
            kr = table[n0]  # (Qc, C, kmax)
            sk = torch.einsum("qckd,qd->qck", K[kr.clamp(min=0)].float(), q).masked_fill(kr < 0, float("-inf"))
            s = torch.where(has[n0], w * s + (1.0 - w) * sk.max(2).values, s)
        s = s.masked_fill(~ok, float("-inf"))
        key = torch.where(ok, nd, torch.full_like(nd, torch.iinfo(torch.int64).max))
        o1 = torch.argsort(key, dim=1, stable=True)
        o2 = torch.argsort(s.gather(1, o1), dim=1, descending=True, stable=True)
        o = o1.gather(1, o2)[:, :out_v.shape[1]]
        out_v[q0:q0 + step], out_i[q0:q0 + step] = s.gather(1, o), nd.gather(1, o)
    out_i = torch.where(torch.isfinite(out_v), out_i, torch.full_like(out_i, -1))
    return out_v, out_i
