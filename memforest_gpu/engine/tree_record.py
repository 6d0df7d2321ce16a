"""Recording a store's event trees (:class:`~memforest_gpu.store.event_trees.EventTrees`) and
finding
them again: which row holds an original id, and which input row each output row starts at.

:func:`record_event_trees` is what :func:`~memforest_gpu.engine.compress` writes into its output
so that ``compact`` can place new memories into the same trees later; :mod:`.compact` uses
the two lookups to follow trees and centres through merges.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from ..config import PartitionConfig
from ..store.event_trees import EventTrees, TenantTrees
from ..store.memory_store import MemoryStore
from .placement import tree_radius

__all__ = ["record_event_trees", "with_centres", "rows_of_originals", "first_rows", "partition_key", "first_sources"]


def partition_key(cfg: PartitionConfig) -> dict:
    """The partition config fields the event trees record (a tenant whose trees were built with
    other values is partitioned again at its next compaction)."""
    return dataclasses.asdict(cfg)


def first_sources(store: MemoryStore, rows: np.ndarray) -> list[str]:
    """The first original id of each of ``rows``: the key the event trees name a centre node by."""

    if len(rows) == 0:
        return []
    return pc.list_element(store.sources.arrow.take(pa.array(np.asarray(rows, dtype=np.int64))), 0).to_pylist()


def rows_of_originals(store: MemoryStore, ids) -> np.ndarray:
    """The row whose ``sources`` hold each id (-1: none); ``ids`` a list or Arrow array of
    strings. Shape: ids (M,) -> (M,) int64"""

    if len(ids) == 0:
        return np.zeros(0, dtype=np.int64)
    ids = ids.cast(pa.large_string()) if isinstance(ids, pa.Array) else pa.array(list(ids), type=pa.large_string())
    # the hash table is over the ids asked (often a few thousand tree centres), not over every
    # source of the store: each source looks itself up among the distinct ids
    enc = pc.dictionary_encode(ids)  # the distinct ids, and each id's place among them, in one pass
    uniq = enc.dictionary
    src = store.sources.arrow
    hit = pc.index_in(src.flatten().cast(pa.large_string()), value_set=uniq).fill_null(-1)
    hit = hit.to_numpy(zero_copy_only=False).astype(np.int64)
    parent = pc.list_parent_indices(src).to_numpy(zero_copy_only=False).astype(np.int64)
    found = np.flatnonzero(hit >= 0)
    u, first = np.unique(hit[found], return_index=True)  # a source held twice: its first row
    row = np.full(len(uniq), -1, dtype=np.int64)
    row[u] = parent[found[first]]
    return row[enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)]


def first_rows(inp: MemoryStore, out: MemoryStore) -> np.ndarray:
    """For each row of ``out`` (a compression of ``inp``), the smallest ``inp`` row it holds.
    Shape: -> (len(out),) int64"""

    src = out.sources.arrow
    if len(out) == 0:
        return np.zeros(0, dtype=np.int64)
    rows = rows_of_originals(inp, src.flatten())
    parent = pc.list_parent_indices(src).to_numpy(zero_copy_only=False).astype(np.int64)
    first = np.full(len(out), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, parent, rows)
    return first


def with_centres(inp: MemoryStore, tree: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """``centre`` with every tree that has none (-1: the keep rule or ``merge_within`` split
    it off its k-means tree, engine/constraints.py) given the member nearest its mean, as
    compaction does for a tree whose centre is gone. Call it before an output overwrites the
    input's vectors in place. Shape: tree (N,), centre (T,) -> (T,)"""

    lost = centre < 0
    if not lost.any():
        return centre
    rows = np.nonzero(lost[tree])[0]  # (M,) the members of those trees
    t = torch.as_tensor(tree[rows], dtype=torch.int64)
    x = inp.embeddings[torch.as_tensor(rows)].cpu().float()  # (M, D)
    mean = torch.zeros(len(centre), x.shape[1]).index_put_((t,), x, accumulate=True)  # (T, D): the direction
    score = (x * mean[t]).sum(1).numpy()  # (M,)
    order = np.lexsort((rows, -score, tree[rows]))  # by tree, best score first, lowest row on ties
    first = np.ones(len(order), dtype=bool)
    first[1:] = tree[rows][order][1:] != tree[rows][order][:-1]
    out = centre.copy()
    out[tree[rows][order][first]] = rows[order][first]
    return out


def record_event_trees(out: MemoryStore, inp: MemoryStore, tree: np.ndarray, tree_tenant: np.ndarray,
                  centre: np.ndarray, firsts: np.ndarray, names: list[str], cfg: PartitionConfig) -> MemoryStore:
    """``out`` with the event trees of a full partition of ``inp``: each output row in the tree of
    its first input row, tenant-local ids (trees are tenant-major), each tree's centre by the
    first original id of its centre node, and each tree's radius.

    Shape: tree (N_in,) global tree ids, tree_tenant (T,) sorted codes into ``names``,
    centre (T,) input rows, firsts (N_out,) input rows
    """

    T = len(tree_tenant)
    start = np.searchsorted(tree_tenant, np.arange(len(names)), side="left")  # first tree of each tenant
    local = np.arange(T, dtype=np.int64) - start[tree_tenant]
    gtree = tree[firsts] if len(firsts) else np.zeros(0, dtype=np.int64)
    ids = first_sources(inp, centre)
    dev = out.device
    rad = tree_radius(out.embeddings, torch.as_tensor(gtree, dtype=torch.int64, device=dev),
                      torch.as_tensor(rows_of_originals(out, ids), dtype=torch.int64, device=dev))
    rad = rad.cpu().numpy().astype(np.float32).tolist()
    sizes = np.bincount(inp.tenant_codes_np, minlength=len(names))
    key = partition_key(cfg)
    tenants = {}
    for c in np.unique(tree_tenant).tolist():
        lo = int(start[c])
        hi = int(np.searchsorted(tree_tenant, c, side="right"))
        tenants[names[c]] = TenantTrees(ids[lo:hi], int(sizes[c]), 0, key, rad[lo:hi])
    row_tree = local[gtree]
    out.event_trees = EventTrees(row_tree.astype(np.int64), tenants)
    return out
