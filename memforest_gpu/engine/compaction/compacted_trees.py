"""The event trees of the tenants a compaction works on (:mod:`.replan`): every row of
theirs in a tree, with centres and radii (:class:`CompactedTrees`).

A tenant's recorded trees are read back (centres by original id, a lost centre replaced, a
tree left empty dropped) and its new rows placed (:mod:`memforest_gpu.engine.placement`), or
it is partitioned again in full when its state is missing, was built with another config, or
it has grown ``repartition_growth`` times since (:func:`event_trees_of`). Radii come from the
state and are recomputed only for the trees that received rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow.compute as pc
import torch

from ...config import CompactConfig, CompressConfig
from ...store.event_trees import EventTrees
from ...store.memory_store import MemoryStore
from ..output import partition_key, rows_of_originals
from ..partition import partition_nodes
from ..placement import place_new, repair_centres, tree_radius

__all__ = ["CompactedTrees", "event_trees_of"]


@dataclass
class CompactedTrees:
    """The event trees of W while it is compacted. Shape: tree (N_W,) local ids; tree_start
    (n_ten + 1,); centre (T,) W rows; size, originals, tree_tenant (T,); per tenant (n_ten,):
    new, placed, new_trees, repartitioned."""

    tree: np.ndarray
    tree_start: np.ndarray
    centre: np.ndarray
    size: np.ndarray
    originals: np.ndarray
    tree_tenant: np.ndarray
    new: np.ndarray
    placed: np.ndarray
    new_trees: np.ndarray
    repartitioned: np.ndarray
    states: dict  # tenant -> its TenantTrees before this compaction (or None)
    touched: np.ndarray  # (T,) trees that received new rows (every tree of a tenant partitioned in full)
    key: dict  # the partition config the trees of a new partition are built with
    radius: np.ndarray  # (T,) float32 each tree's radius after placement


def event_trees_of(W: MemoryStore, cfg: CompressConfig, limits: CompactConfig, tile_elements: int) -> CompactedTrees:
    """Every row of W in a tree: new rows placed, or the tenant partitioned in full."""

    names = W.tenant_table
    n_ten = len(names)
    key = partition_key(cfg.partition)
    tree, starts, centre, full, new, states = _known_trees(W, cfg, limits, key, tile_elements)
    arrived = tree < 0  # rows this compaction places (or partitioned in full)
    dev = W.device
    gtree = torch.as_tensor(np.where(tree >= 0, starts[W.tenant_codes_np] + tree, -1), dtype=torch.int64, device=dev)
    c0 = torch.as_tensor(centre, dtype=torch.int64, device=dev)
    c = repair_centres(W.embeddings, gtree, c0)
    rad = _cached_radius(W, gtree, c, c0, states, full, starts)
    p = place_new(W.embeddings, W.timestamps, W.tenant_codes, names, tree, starts, c, cfg.partition, radius=rad,
                  tile_elements=tile_elements)
    centres = _merge_centres(c.cpu().numpy(), starts, p.n_trees, p.new_centres)
    T0 = int(p.n_trees.sum())
    rad = torch.cat([rad, torch.full((T0 - rad.shape[0],), float("inf"), device=dev)])[
        torch.as_tensor(_old_index(starts, p.n_trees), device=dev)]
    g = np.r_[0, np.cumsum(p.n_trees)][W.tenant_codes_np] + p.tree
    got = torch.as_tensor(np.bincount(g[arrived], minlength=T0) > 0, device=dev)  # received rows: radius again
    fresh = tree_radius(W.embeddings, torch.as_tensor(g, device=dev), torch.as_tensor(centres, device=dev), got)
    rad = torch.where(got, fresh, rad).cpu().numpy()
    tree_l, k, centres, rad = _drop_empty(p.tree, W.tenant_codes_np, p.n_trees, centres, rad)
    starts = np.r_[0, np.cumsum(k)]
    g = starts[W.tenant_codes_np] + tree_l
    T = int(starts[-1])
    orig = pc.list_value_length(W.sources.arrow).to_numpy(zero_copy_only=False).astype(np.int64)
    touched = np.bincount(g[arrived], minlength=T) > 0
    originals = np.bincount(g, weights=orig, minlength=T).astype(np.int64)
    return CompactedTrees(tree_l, starts, centres, np.bincount(g, minlength=T), originals,
                          np.repeat(np.arange(n_ten), k), new, p.placed, p.new_trees, full, states, touched, key, rad)


def _known_trees(W: MemoryStore, cfg: CompressConfig, limits: CompactConfig, key: dict, tile_elements: int):
    """The trees W's rows are in before placement: a tenant's recorded ones (a row not placed
    yet: -1), or a new full partition. Returns (tree (N_W,) local ids or -1, tree_start,
    centre rows (T,), full (n_ten,) bool, new rows per tenant, states)."""
    names = W.tenant_table
    old = W.event_trees if W.event_trees is not None else EventTrees.empty(len(W))
    states = {t: old.tenants.get(t) for t in names}
    tree = old.tree.copy()
    n_trees = np.array([s.n_trees if s is not None else 0 for s in states.values()], dtype=np.int64)
    bad = (tree >= n_trees[W.tenant_codes_np]) | (tree < 0)
    tree[bad] = -1
    new = np.bincount(W.tenant_codes_np[bad], minlength=len(names))
    full = np.array([limits.repartition or s is None or s.config != key or s.n_trees == 0
                     or s.arrived + new[j] >= limits.repartition_growth * max(s.partitioned, 1)
                     for j, s in enumerate(states.values())], dtype=bool)
    tree[full[W.tenant_codes_np]] = -1
    n_trees[full] = 0
    centre = _centre_rows(W, [states[t] for t in names], ~full)
    part_rows, part_centres, k_full = _partition_tenants(W, full, cfg, tile_elements)
    tree[part_rows] = part_centres[0]
    n_trees[full] = k_full[full]
    starts = np.r_[0, np.cumsum(n_trees)]
    centre_all = np.full(int(starts[-1]), -1, dtype=np.int64)
    kept = [centre[j] for j in np.flatnonzero(~full).tolist()]
    centre_all[np.repeat(~full, n_trees)] = np.concatenate(kept) if kept else np.zeros(0, dtype=np.int64)
    centre_all[np.repeat(full, n_trees)] = part_centres[1]
    return tree, starts, centre_all, full, new, states


def _cached_radius(W, gtree, c, c0, states: dict, full: np.ndarray, starts: np.ndarray) -> torch.Tensor:
    """Each tree's radius: the one recorded with it, else (or when its centre changed, or its
    tenant was partitioned again) computed from its members. Shape: -> (T,)"""
    T = int(starts[-1])
    rad = np.full(T, np.nan, dtype=np.float32)
    for j, t in enumerate(W.tenant_table):
        s = states[t]
        if not full[j] and s is not None and s.radius is not None and len(s.radius) == s.n_trees:
            rad[starts[j]:starts[j + 1]] = s.radius
    rad = torch.as_tensor(rad, device=W.device)
    want = torch.isnan(rad) | (c != c0)
    return torch.where(want, tree_radius(W.embeddings, gtree, c, want), rad)


def _old_index(starts: np.ndarray, n_trees: np.ndarray) -> np.ndarray:
    """For the trees after placement (each tenant's own, then its new ones), the index of the
    same tree before placement, or the first index past them (a new tree: +inf there)."""
    T_old = int(starts[-1])
    old_k = np.diff(starts)
    new_starts = np.r_[0, np.cumsum(n_trees)]
    local = np.arange(int(n_trees.sum())) - np.repeat(new_starts[:-1], n_trees)
    ten = np.repeat(np.arange(len(n_trees)), n_trees)
    return np.where(local < old_k[ten], starts[:-1][ten] + local, T_old)


def _centre_rows(W: MemoryStore, states: list, keep: np.ndarray) -> list[np.ndarray]:
    """The W row of each tree's centre (-1: not found) for tenants ``keep``, by original id."""
    ids = [c for j, s in enumerate(states) if keep[j] for c in s.centres]
    rows = rows_of_originals(W, ids)
    codes = W.tenant_codes_np
    out, lo = [], 0
    for j, s in enumerate(states):
        if not keep[j]:
            out.append(np.zeros(0, dtype=np.int64))
            continue
        r = rows[lo:lo + s.n_trees]
        lo += s.n_trees
        ok = r >= 0
        r[ok] = np.where(codes[r[ok]] == j, r[ok], -1)  # an id must belong to its own tenant
        out.append(r)
    return out


def _partition_tenants(W: MemoryStore, full: np.ndarray, cfg: CompressConfig, tile_elements: int):
    """A full partition of the tenants ``full``: (their W rows, (local trees, centre rows in
    tree order)), trees per tenant (n_ten,)."""
    names = W.tenant_table
    k = np.zeros(len(names), dtype=np.int64)
    rows = np.flatnonzero(full[W.tenant_codes_np])
    if len(rows) == 0:
        return rows, (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)), k
    ten, sub = np.unique(W.tenant_codes_np[rows], return_inverse=True)
    r = torch.as_tensor(rows, dtype=torch.int64, device=W.device)
    part = partition_nodes(W.embeddings[r], W.timestamps[r], torch.as_tensor(sub, device=W.device),
                           [names[t] for t in ten.tolist()], cfg.partition, tile_elements=tile_elements)
    gt, tt = part.tree.cpu().numpy(), part.tree_tenant.cpu().numpy()
    first = np.searchsorted(tt, np.arange(len(ten)), side="left")
    k[ten] = np.bincount(tt, minlength=len(ten))
    return rows, (gt - first[tt[gt]], rows[part.centre.cpu().numpy()]), k


def _drop_empty(tree: np.ndarray, codes: np.ndarray, n_trees: np.ndarray, centres: np.ndarray, rad: np.ndarray):
    """Trees left without a member (their nodes were deleted outside memforest) are dropped and
    each tenant's trees numbered again, in order. Returns (tree, trees per tenant, centres,
    radii)."""
    starts = np.r_[0, np.cumsum(n_trees)]
    g = starts[codes] + tree
    keep = np.bincount(g, minlength=int(starts[-1])) > 0
    if keep.all():
        return tree, n_trees, centres, rad
    new_g = np.cumsum(keep) - 1
    k = np.bincount(np.repeat(np.arange(len(n_trees)), n_trees)[keep], minlength=len(n_trees))
    return new_g[g] - np.r_[0, np.cumsum(k)][codes], k, centres[keep], rad[keep]


def _merge_centres(centre: np.ndarray, starts: np.ndarray, n_trees: np.ndarray, new_centres: np.ndarray):
    """Centre rows in the order of the trees after placement: each tenant's own, then its new
    ones."""
    old_k = np.diff(starts)
    out = np.empty(int(n_trees.sum()), dtype=np.int64)
    new_starts = np.r_[0, np.cumsum(n_trees)]
    is_old = np.arange(len(out)) - np.repeat(new_starts[:-1], n_trees) < np.repeat(old_k, n_trees)
    out[is_old] = centre
    out[~is_old] = new_centres
    return out
