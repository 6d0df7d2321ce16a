"""The output store: the live nodes of a run, in order of their earliest original, and their
keys (:func:`output_keys`, at the end)."""
from __future__ import annotations

import numpy as np
import torch

from ..config import MergeConfig
from ..kernels.blocks import stream_rows
from ..store.keys import NodeKeys
from ..store.memory_store import MemoryStore
from ..store.merged_keys import derive_keys, fold_keys
from .node_table import NodeTable

__all__ = ["assemble", "output_keys", "OutputKeys"]


def assemble(table: NodeTable, live: np.ndarray, embeddings: torch.Tensor,
             merged: torch.Tensor | list[torch.Tensor] | None, *, in_place: bool = False, chunk: int = 1 << 16
             ) -> MemoryStore:
    """Rows ``live`` of the table as a store. Row ``i < N`` is an original (vector
    ``embeddings[i]``), row ``N + j`` the j-th merged node (vector ``merged[j]``); the full
    (N + M, D) concatenation is never built. ``merged`` may be a list of blocks (one per
    round, in order): each is read once and released from the list, so neither their
    concatenation nor the dead merged vectors outlive their block.

    ``in_place``: the output's vectors are written into ``embeddings`` itself (overwritten;
    the output's are its first rows), so no second (N_out, D) tensor is made. That is safe
    in one forward pass: a live original's output position is at most its row (the rows
    before it in the output each hold a distinct earlier original), so moving the originals
    ``chunk`` rows at a time in output order never overwrites a row still to be read, and the
    merged vectors are written after every original has moved.

    ``merged=None``: every live row's vector is already in ``embeddings``, at the row of its
    earliest original (a run that reused the dead rows, :meth:`~.vectors.NodeVectors.put`); the
    same forward pass moves them all (output position <= that row).

    Shape: live (N + M,) bool host, embeddings (N, D), merged (M, D) or [(P_r, D)] or None ->
           store of live.sum() rows
    """
    N, D = embeddings.shape
    rows = table.output_order(np.flatnonzero(live))
    dev = embeddings.device
    if merged is None:
        if not in_place:
            raise ValueError("merged=None reads every vector from embeddings: in place only")
        src = table.first[rows]  # output order is by it: position i <= src[i]
        assert (np.arange(len(rows)) <= src).all(), "a live row's output position must not pass its row"
        move = np.flatnonzero(np.arange(len(rows)) != src)
        _copy_rows(embeddings, move, embeddings, src[move], chunk)
        return table.to_store(rows, embeddings[:len(rows)])
    out = embeddings[:len(rows)] if in_place else torch.empty(len(rows), D, dtype=embeddings.dtype, device=dev)
    orig = rows < N
    pos_o, pos_m = np.flatnonzero(orig), np.flatnonzero(~orig)
    src_o = rows[orig]
    if in_place:
        assert (pos_o <= src_o).all(), "a live original's output position must not pass its row"
        move = np.flatnonzero(pos_o != src_o)  # originals before the first merge stay where they are
        _copy_rows(out, pos_o[move], embeddings, src_o[move], chunk)  # gathered, then written: sources >= targets
    else:
        _copy_rows(out, pos_o, embeddings, src_o, chunk)
    blocks = merged if isinstance(merged, list) else [merged]
    j_m = rows[~orig] - N  # merged index of each merged output row
    lo = 0
    for b in range(len(blocks)):
        blk = blocks[b]
        hi = lo + int(blk.shape[0])
        sel = np.flatnonzero((j_m >= lo) & (j_m < hi))
        _copy_rows(out, pos_m[sel], blk, j_m[sel] - lo, chunk)
        if isinstance(merged, list):
            blocks[b] = None  # release the block
        lo = hi
    return table.to_store(rows, out)


def _copy_rows(out: torch.Tensor, at: np.ndarray, src: torch.Tensor, rows: np.ndarray, chunk: int) -> None:
    """``out[at] = src[rows]``, at most ``chunk`` rows at a time (no full-size gathered copy; a
    cache-sized block on the CPU), in order: each block is gathered, then written.
    Shape: at, rows (R,) host int, src (S, D) -> writes R rows of out (N, D)"""
    dev = out.device
    chunk = min(chunk, stream_rows(dev, 2 * out.shape[1] * out.element_size(), at_least=1 << 10))
    for c in range(0, len(at), chunk):
        idx = torch.as_tensor(rows[c:c + chunk], dtype=torch.int64, device=src.device)
        out.index_copy_(0, torch.as_tensor(at[c:c + chunk], dtype=torch.int64, device=dev),
                        src.index_select(0, idx).to(device=dev, dtype=out.dtype))


# The output step's keys: what each output node is searched by besides its text's vector
# (:mod:`memforest_gpu.store.keys`), made from the run's input store when ``merge.keys`` asks for
# them (:func:`~memforest_gpu.store.merged_keys.derive_keys`).
class OutputKeys:
    """Keys made before the output is assembled (assembling may overwrite the input's vectors),
    attached to it after; ``fold``: blended into the nodes' own vectors instead, one vector per
    node (:func:`~memforest_gpu.store.merged_keys.fold_keys`)."""

    def __init__(self, keys: NodeKeys | None, vectors: str = "float32", fold: bool = False):
        self.keys = keys
        self.vectors = vectors
        self.fold = fold

    def attach(self, out: MemoryStore) -> MemoryStore:
        if self.keys is not None:
            out.keys = self.keys.to(out.device)
            if self.fold:
                fold_keys(out, out.keys)
        out.vector_codes = self.vectors  # how its file holds the vectors (store/codes.py)
        return out


def output_keys(store: MemoryStore, table, live: np.ndarray, merge: MergeConfig, saved=None) -> OutputKeys:
    """The keys of the live rows of a run's node table (in output order), or none when
    ``merge.keys`` is 0. ``table``: the run's :class:`~.node_table.NodeTable`. ``saved``: the
    int8 codes of input rows whose vectors the run overwrote (:meth:`~.vectors.NodeVectors.put`)."""
    if merge.keys == 0:
        return OutputKeys(None, merge.vectors)
    out_sources = table.sources_arrow(table.output_order(np.flatnonzero(live)))
    return OutputKeys(derive_keys(store, out_sources, max_keys=merge.max_keys, text_weight=merge.text_weight,
                                  codes=merge.vectors, saved=saved), merge.vectors, fold=merge.folds)
