"""The output step's keys: what each output node is searched by besides its text's vector
(:mod:`memforest_gpu.store.keys`), made from the run's input store when ``merge.keys`` asks for
them (:func:`~memforest_gpu.store.merged_keys.derive_keys`)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from ..config import MergeConfig
from ..store.keys import NodeKeys
from ..store.memory_store import MemoryStore
from ..store.merged_keys import derive_keys

__all__ = ["output_keys", "OutputKeys"]


class OutputKeys:
    """Keys made before the output is assembled (assembling may overwrite the input's vectors),
    attached to it after."""

    def __init__(self, keys: NodeKeys | None, vectors: str = "float32"):
        self.keys = keys
        self.vectors = vectors

    def attach(self, out: MemoryStore) -> MemoryStore:
        if self.keys is not None:
            out.keys = self.keys.to(out.device)
        out.vector_codes = self.vectors  # how its file holds the vectors (store/codes.py)
        return out


def output_keys(store: MemoryStore, table, live: np.ndarray, merge: MergeConfig) -> OutputKeys:
    """The keys of the live rows of a run's node table (in output order), or none when
    ``merge.keys`` is 0. ``table``: the run's :class:`~.node_table.NodeTable`."""
    if merge.keys == 0:
        return OutputKeys(None, merge.vectors)
    rows = table.output_order(np.flatnonzero(live))
    n = table.n
    ls = pa.large_list(pa.large_string())
    orig = rows < n
    perm = np.empty(len(rows), dtype=np.int64)  # output position -> index in [originals, merged]
    perm[np.flatnonzero(orig)] = np.arange(int(orig.sum()))
    perm[np.flatnonzero(~orig)] = int(orig.sum()) + np.arange(int((~orig).sum()))
    src = pa.concat_arrays([store.sources.arrow.cast(ls).take(pa.array(rows[orig], type=pa.int64())),
                           pa.array([table.m_sources[j] for j in (rows[~orig] - n).tolist()], type=ls)])
    out_sources = src.take(pa.array(perm, type=pa.int64()))
    return OutputKeys(derive_keys(store, out_sources, max_keys=merge.max_keys, text_weight=merge.text_weight,
                                  codes=merge.vectors), merge.vectors)
