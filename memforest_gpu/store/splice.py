"""Joining stores row-wise: the rows of several stores in one order (what ``compact`` writes
back: the untouched rows and the compacted ones, each at its place), and appending new
memories to a store."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from .columns import ArrowView, TenantView, compact_codes
from .event_trees import EventTrees
from .keys import NodeKeys
from .memory_store import MemoryStore

__all__ = ["splice", "append"]


def splice(parts: list[MemoryStore], keys: list[np.ndarray], *, rows: list | None = None,
           event_trees: EventTrees | None = None) -> MemoryStore:
    """The rows of ``parts`` as one store, ordered by ``keys`` (stable; ties keep the parts'
    order). ``rows[j]``: only these rows of ``parts[j]`` (``None``: all), taken without
    copying the part first. ``event_trees``: the result's tree state (its ``tree`` in the
    *output* order), else each part's trees (-1 for a part without) with every part's
    tenant states.

    Shape: keys[j] (len(rows[j]),) -> store of sum(len) rows
    """

    sel = [np.arange(len(p)) if r is None else np.asarray(r, dtype=np.int64)
           for p, r in zip(parts, rows or [None] * len(parts))]
    order = np.argsort(np.concatenate(keys), kind="stable") if parts else np.zeros(0, dtype=np.int64)
    offsets = np.cumsum([0] + [len(p) for p in parts])
    gi = pa.array(np.concatenate([o + r for o, r in zip(offsets, sel)])[order], type=pa.int64())

    def col(name):
        return pa.chunked_array([getattr(p, name) for p in parts]).take(gi).combine_chunks()

    first = parts[0]
    dev = first.device
    pos = np.empty(len(order), dtype=np.int64)
    pos[order] = np.arange(len(order))  # where each selected row goes
    emb = torch.empty(len(order), first.dim, dtype=first.embeddings.dtype, device=dev)
    ts = torch.empty(len(order), dtype=torch.float64, device=dev)
    code_of: dict[str, int] = {}
    codes = np.empty(len(order), dtype=np.int64)
    lo = 0
    for p, r in zip(parts, sel):
        at = torch.as_tensor(pos[lo:lo + len(r)], dtype=torch.int64, device=dev)
        ri = torch.as_tensor(r, dtype=torch.int64, device=p.device)
        emb[at] = p.embeddings[ri].to(dev, emb.dtype)
        ts[at] = p.timestamps[ri].to(dev)
        remap = np.array([code_of.setdefault(t, len(code_of)) for t in p.tenant_table], dtype=np.int64)
        codes[pos[lo:lo + len(r)]] = remap[p.tenant_codes_np[r]] if len(r) else remap[:0]
        lo += len(r)
    names, codes = compact_codes(list(code_of), codes)
    if event_trees is None and any(p.event_trees is not None for p in parts):
        tree = np.concatenate([p.event_trees.tree[r] if p.event_trees is not None else np.full(len(r), -1,
                                                                                               dtype=np.int64)
                               for p, r in zip(parts, sel)])[order]
        states = {t: s for p in parts if p.event_trees is not None for t, s in p.event_trees.tenants.items()}
        event_trees = EventTrees(tree, {t: states[t] for t in names if t in states})
    node_keys = NodeKeys.concat([p.keys.take(r) if p.keys is not None else None for p, r in zip(parts, sel)],
                                [len(r) for r in sel], first.dim, dev)  # what merged nodes are searched by
    return MemoryStore(col("_ids"), col("_texts"), emb, ts, TenantView(names, codes), col("_sources"),
                       ArrowView(col("_meta")), first.embedder, first.time_format, event_trees,
                       node_keys.take(order) if node_keys is not None else None)


def append(store: MemoryStore, new: MemoryStore) -> MemoryStore:
    """``store`` followed by the rows of ``new`` (not placed in any tree yet). Refuses an id of
    ``new`` that ``store`` already holds as a node or inside a merged node's sources (every
    original stays in exactly one node), and vectors of another dimension or model. The result
    holds its vectors as ``store`` does (``vector_codes``)."""

    if new.dim != store.dim:
        raise ValueError(f"new memories' embeddings must have the store's dimension ({store.dim}), got {new.dim}")
    if store.embedder is not None and new.embedder is not None and new.embedder != store.embedder:
        raise ValueError(f"new memories must be embedded by the store's model ({store.embedder!r}), "
                         f"got {new.embedder!r}")
    known = pa.concat_arrays([store._sources.flatten().cast(pa.large_string()), store._ids])
    dup = pc.is_in(new._ids, value_set=known).to_numpy(zero_copy_only=False)
    if dup.any():
        raise ValueError(f"id of a new memory must not be in the store already, got {new._ids[int(np.argmax(dup))]}")
    dup_src = pc.is_in(new._sources.flatten().cast(pa.large_string()), value_set=known).to_numpy(zero_copy_only=False)
    if dup_src.any():
        raise ValueError("sources of a new memory must not be in the store already, got "
                         f"{new._sources.flatten()[int(np.argmax(dup_src))]}")
    new = MemoryStore(new._ids, new._texts, new.embeddings.to(store.device), new.timestamps.to(store.device),
                      new.tenants, new._sources, ArrowView(new._meta), store.embedder, store.time_format,
                      EventTrees.empty(len(new)), new.keys)
    base = store if store.event_trees is not None else MemoryStore(
        store._ids, store._texts, store.embeddings, store.timestamps, store.tenants, store._sources,
        ArrowView(store._meta), store.embedder, store.time_format, EventTrees.empty(len(store)), store.keys)
    n = len(store)
    out = splice([base, new], [np.arange(n), n + np.arange(len(new))])
    out.vector_codes = store.vector_codes  # the store's file keeps its vectors' codes (.codes)
    return out
