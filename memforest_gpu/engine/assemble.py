"""The output store: the live nodes of a run, in order of their earliest original."""
from __future__ import annotations

import numpy as np
import torch

from ..store.memory_store import MemoryStore
from .node_table import NodeTable

__all__ = ["assemble"]


def assemble(table: NodeTable, live: np.ndarray, embeddings: torch.Tensor,
             merged: torch.Tensor | list[torch.Tensor]) -> MemoryStore:
    """Rows ``live`` of the table as a store. Row ``i < N`` is an original (vector
    ``embeddings[i]``), row ``N + j`` the j-th merged node (vector ``merged[j]``); the full
    (N + M, D) concatenation is never built. ``merged`` may be a list of blocks (one per
    round, in order): each is read once and released from the list, so neither their
    concatenation nor the dead merged vectors outlive their block.

    Shape: live (N + M,) bool host, embeddings (N, D), merged (M, D) or [(P_r, D)] -> store of live.sum() rows
    """
    N, D = embeddings.shape
    rows = table.output_order(np.flatnonzero(live))
    dev = embeddings.device
    out = torch.empty(len(rows), D, dtype=embeddings.dtype, device=dev)
    orig = rows < N
    pos_o, pos_m = np.flatnonzero(orig), np.flatnonzero(~orig)
    t = lambda a: torch.as_tensor(a, dtype=torch.int64, device=dev)  # noqa: E731
    out[t(pos_o)] = embeddings[t(rows[orig])]
    blocks = merged if isinstance(merged, list) else [merged]
    j_m = rows[~orig] - N  # merged index of each merged output row
    lo = 0
    for b in range(len(blocks)):
        blk = blocks[b]
        hi = lo + int(blk.shape[0])
        sel = np.flatnonzero((j_m >= lo) & (j_m < hi))
        if len(sel):
            out[t(pos_m[sel])] = blk[t(j_m[sel] - lo)].to(device=dev, dtype=embeddings.dtype)
        if isinstance(merged, list):
            blocks[b] = None  # release the block
        lo = hi
    return table.to_store(rows, out)
