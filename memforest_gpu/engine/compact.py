"""``compact``: keep every tenant within a budget as memories arrive, re-planning only the
trees that received memories or must shrink (docs/compaction.md).

    store ─over budget?─▶ the over-budget tenants' rows W
      ├─ trees    each tenant's forest (:class:`~memforest_gpu.store.forest.Forest`): new rows placed into
      │           its trees (:mod:`.placement`), or a full partition when it has none, was built with
      │           another config, or has doubled since (``repartition_growth``)
      ├─ quotas   exactly n - floor(low_water * budget) per tenant, over the trees with the most
      │           excess (:mod:`.compact_quotas`)
      ├─ compress those trees only: :func:`~.compress.compress` with the ready Partition and Quotas
      └─ splice   the result back in place of its members (each merged node takes its earliest
                  member's row), trees and centres recorded

Tenants within budget are not touched: only their counts are read. Every original stays in
exactly one node's ``sources``; the same store, config and merger give the same result.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ..config import CompactConfig, CompressConfig
from ..device import resolve_device
from ..store.forest import Forest, TenantForest
from ..store.memory_store import MemoryStore
from ..store.splice import splice
from .compact_quotas import compaction_quotas
from .compress import compress
from .forest import first_rows, first_sources, partition_key, rows_of_originals
from .partition import Partition, partition_nodes
from .placement import place_new, repair_centres, tree_radius
from .quotas import Quotas
from .records import MergeRecord
from .result import CompressReport

__all__ = ["compact", "CompactResult", "CompactReport"]


@dataclass
class CompactReport:
    """What a compaction did: one dict per compacted tenant (``tenant``, ``nodes_in``,
    ``budget``, ``keep``, ``nodes_out``, ``removed``, ``shortfall``, ``new``, ``placed``,
    ``new_trees``, ``trees``, ``trees_replanned``, ``repartitioned``)."""

    tenants: list[dict]
    nodes_in: int
    nodes_out: int
    tenants_in: int
    merges: int = 0
    rounds: int = 0
    dry_run: bool = False
    seconds: dict = field(default_factory=dict)
    engine: CompressReport | None = None  # the compress of the re-planned trees

    @property
    def shortfall(self) -> int:
        return sum(t["shortfall"] for t in self.tenants)

    def to_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "engine"}
        d["shortfall"] = self.shortfall
        d["engine"] = self.engine.to_dict() if self.engine is not None else None
        return d


@dataclass
class CompactResult:
    """``store``: the whole store afterwards (``store`` itself when nothing was over budget);
    ``keys`` (len(store),): the input row each output row stands at (a merged node: its
    earliest member's)."""

    store: MemoryStore
    report: CompactReport
    merges: list[MergeRecord]
    keys: np.ndarray


def compact(store: MemoryStore, budget: CompactConfig, config: CompressConfig | None = None, *, merger=None,
            embedder=None, device=None, progress: bool = False, on_round=None, dry_run: bool = False,
            elements: int = 1 << 24) -> CompactResult:
    """Compact every tenant of ``store`` that holds more than its budget down to
    ``floor(low_water * budget)`` nodes (or report the shortfall); see the module docstring.

    ``config``: the compression (default ``CompressConfig()``); its partition fields are
    recorded with the trees. ``merger``, ``embedder``, ``device``, ``progress``, ``on_round``:
    as in :func:`~.compress.compress`. ``dry_run``: place and plan, merge nothing (the
    report says what would be removed where).
    """
    cfg = config or CompressConfig()
    if not isinstance(budget, CompactConfig):
        raise ValueError(f"budget must be a CompactConfig, got {type(budget).__name__}")
    t0 = time.perf_counter()
    names = store.tenant_names()
    counts = np.bincount(store.tenant_codes_np, minlength=len(names))
    limit = np.array([budget.budget(t) or 0 for t in names], dtype=np.int64)
    over = (limit > 0) & (counts > limit)
    rows = np.flatnonzero(over[store.tenant_codes_np])
    report = CompactReport([], len(store), len(store), len(names), dry_run=dry_run)
    if len(rows) == 0:
        report.seconds = {"total": time.perf_counter() - t0}
        return CompactResult(store, report, [], np.arange(len(store)))
    dev = resolve_device(device)
    W = store.take(rows).to(dev)  # the over-budget tenants, in store order
    report.seconds["select"] = time.perf_counter() - t0
    f = _forest_of(W, cfg, budget, elements)
    report.seconds["place"] = time.perf_counter() - t0 - report.seconds["select"]
    per_tree, remove, short = compaction_quotas(f.size, f.originals, f.tree_tenant,
                                                np.array([budget.keep(t) for t in W.tenant_table]), f.touched,
                                                budget.slack)
    report.tenants = _rows(W, f, per_tree, remove, short, budget)
    if dry_run:
        report.seconds["total"] = time.perf_counter() - t0
        return CompactResult(store, report, [], np.arange(len(store)))
    t1 = time.perf_counter()
    res, S_rows = _replan(W, f, per_tree, cfg, merger, embedder, dev, progress, on_round, elements)
    report.seconds["compress"] = time.perf_counter() - t1
    t1 = time.perf_counter()
    out, keys = _splice_back(store, rows, W, f, S_rows, res)
    report.seconds["splice"] = time.perf_counter() - t1
    report.seconds["total"] = time.perf_counter() - t0
    report.nodes_out = len(out)
    if res is not None:
        report.engine, report.merges, report.rounds = res.report, res.report.merges, res.report.rounds
    left = dict(zip(out.tenant_table, np.bincount(out.tenant_codes_np, minlength=len(out.tenant_table)).tolist()))
    for r in report.tenants:  # what the merging reached (a node cap may stop it short)
        r["nodes_out"] = left[r["tenant"]]
        r["removed"] = r["nodes_in"] - r["nodes_out"]
        r["shortfall"] = max(0, r["nodes_out"] - r["keep"])
    return CompactResult(out, report, res.merges if res is not None else [], keys)


@dataclass
class _Trees:
    """The forest of W while it is compacted. Shape: tree (N_W,) local ids; tree_start
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
    states: dict  # tenant -> its TenantForest before this compaction (or None)
    touched: np.ndarray  # (T,) trees that received new rows (every tree of a tenant partitioned in full)
    key: dict  # the partition config the trees of a new partition are built with
    radius: np.ndarray  # (T,) float32 each tree's radius after placement


def _forest_of(W: MemoryStore, cfg: CompressConfig, budget: CompactConfig, elements: int) -> _Trees:
    """Every row of W in a tree: new rows placed, or the tenant partitioned in full."""
    import pyarrow.compute as pc

    names = W.tenant_table
    n_ten = len(names)
    key = partition_key(cfg.partition)
    tree, starts, centre, full, new, states = _known_trees(W, cfg, budget, key, elements)
    arrived = tree < 0  # rows this compaction places (or partitioned in full)
    dev = W.device
    gtree = torch.as_tensor(np.where(tree >= 0, starts[W.tenant_codes_np] + tree, -1), dtype=torch.int64, device=dev)
    c0 = torch.as_tensor(centre, dtype=torch.int64, device=dev)
    c = repair_centres(W.embeddings, gtree, c0)
    rad = _cached_radius(W, gtree, c, c0, states, full, starts)
    p = place_new(W.embeddings, W.timestamps, W.tenant_codes, names, tree, starts, c, cfg.partition, radius=rad,
                  budget=elements)
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
    orig = pc.list_value_length(W._sources).to_numpy(zero_copy_only=False).astype(np.int64)
    touched = np.bincount(g[arrived], minlength=T) > 0
    return _Trees(tree_l, starts, centres, np.bincount(g, minlength=T), np.bincount(g, weights=orig, minlength=T)
                  .astype(np.int64), np.repeat(np.arange(n_ten), k), new, p.placed, p.new_trees, full,
                  states, touched, key, rad)


def _known_trees(W: MemoryStore, cfg: CompressConfig, budget: CompactConfig, key: dict, elements: int):
    """The trees W's rows are in before placement: a tenant's recorded ones (a row not placed
    yet: -1), or a new full partition. Returns (tree (N_W,) local ids or -1, tree_start,
    centre rows (T,), full (n_ten,) bool, new rows per tenant, states)."""
    names = W.tenant_table
    old = W.forest if W.forest is not None else Forest.empty(len(W))
    states = {t: old.tenants.get(t) for t in names}
    tree = old.tree.copy()
    n_trees = np.array([s.n_trees if s is not None else 0 for s in states.values()], dtype=np.int64)
    bad = (tree >= n_trees[W.tenant_codes_np]) | (tree < 0)
    tree[bad] = -1
    new = np.bincount(W.tenant_codes_np[bad], minlength=len(names))
    full = np.array([budget.repartition or s is None or s.config != key or s.n_trees == 0
                     or s.arrived + new[j] >= budget.repartition_growth * max(s.partitioned, 1)
                     for j, s in enumerate(states.values())], dtype=bool)
    tree[full[W.tenant_codes_np]] = -1
    n_trees[full] = 0
    centre = _centre_rows(W, [states[t] for t in names], ~full)
    part_rows, part_centres, k_full = _partition_tenants(W, full, cfg, elements)
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


def _partition_tenants(W: MemoryStore, full: np.ndarray, cfg: CompressConfig, elements: int):
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
                           [names[t] for t in ten.tolist()], cfg.partition, budget=elements)
    gt, tt = part.tree.cpu().numpy(), part.tree_tenant.cpu().numpy()
    first = np.searchsorted(tt, np.arange(len(ten)), side="left")
    k[ten] = np.bincount(tt, minlength=len(ten))
    return rows, (gt - first[tt[gt]], rows[part.centre.cpu().numpy()]), k


def _drop_empty(tree: np.ndarray, codes: np.ndarray, n_trees: np.ndarray, centres: np.ndarray, rad: np.ndarray):
    """Trees left without a member (their nodes were deleted outside memforest) are dropped and
    each tenant's trees numbered again, in order. Returns (tree, trees per tenant, centres, radii)."""
    starts = np.r_[0, np.cumsum(n_trees)]
    g = starts[codes] + tree
    keep = np.bincount(g, minlength=int(starts[-1])) > 0
    if keep.all():
        return tree, n_trees, centres, rad
    new_g = np.cumsum(keep) - 1
    k = np.bincount(np.repeat(np.arange(len(n_trees)), n_trees)[keep], minlength=len(n_trees))
    return new_g[g] - np.r_[0, np.cumsum(k)][codes], k, centres[keep], rad[keep]


def _merge_centres(centre: np.ndarray, starts: np.ndarray, n_trees: np.ndarray, new_centres: np.ndarray):
    """Centre rows in the order of the trees after placement: each tenant's own, then its new ones."""
    old_k = np.diff(starts)
    out = np.empty(int(n_trees.sum()), dtype=np.int64)
    new_starts = np.r_[0, np.cumsum(n_trees)]
    is_old = np.arange(len(out)) - np.repeat(new_starts[:-1], n_trees) < np.repeat(old_k, n_trees)
    out[is_old] = centre
    out[~is_old] = new_centres
    return out


def _rows(W, f: _Trees, per_tree, remove, short, budget: CompactConfig) -> list[dict]:
    """The plan per tenant (a dry run's report; the merging's outcome replaces nodes_out,
    removed and shortfall)."""
    names = W.tenant_table
    n = np.bincount(W.tenant_codes_np, minlength=len(names))
    trees = np.diff(f.tree_start)
    replanned = np.bincount(f.tree_tenant, weights=per_tree > 0, minlength=len(names)).astype(np.int64)
    return [{"tenant": t, "nodes_in": int(n[j]), "budget": budget.budget(t), "keep": budget.keep(t),
             "nodes_out": int(n[j] - remove[j] + short[j]), "removed": int(remove[j] - short[j]),
             "shortfall": int(short[j]), "new": int(f.new[j]), "placed": int(f.placed[j]),
             "new_trees": int(f.new_trees[j]), "trees": int(trees[j]), "trees_replanned": int(replanned[j]),
             "repartitioned": bool(f.repartitioned[j])} for j, t in enumerate(names)]


def _replan(W, f: _Trees, per_tree, cfg, merger, embedder, dev, progress, on_round, elements):
    """Compress the trees with a quota, as one sub-store with a ready partition and quotas."""
    T = len(per_tree)
    g = f.tree_start[W.tenant_codes_np] + f.tree
    busy = per_tree > 0
    S_rows = np.flatnonzero(busy[g])
    if len(S_rows) == 0:
        return None, S_rows
    S = W.take(S_rows)
    s_code = {t: j for j, t in enumerate(S.tenant_table)}
    trees = np.flatnonzero(busy)  # W's global tree ids with a quota, tenant-major
    sub_tenant = np.array([s_code[W.tenant_table[t]] for t in f.tree_tenant[trees].tolist()], dtype=np.int64)
    order = np.lexsort((trees, sub_tenant))  # S's tree ids must be tenant-major in S's codes
    trees, sub_tenant = trees[order], sub_tenant[order]
    new_id = np.full(T, -1, dtype=np.int64)
    new_id[trees] = np.arange(len(trees))
    s_pos = np.full(len(W), -1, dtype=np.int64)
    s_pos[S_rows] = np.arange(len(S_rows))
    t = lambda a: torch.as_tensor(a, dtype=torch.int64, device=dev)  # noqa: E731
    stree = t(new_id[g[S_rows]])
    part = Partition(stree, t(sub_tenant), t(s_pos[f.centre[trees]]), stree, {}, 0)
    size = f.size[trees]
    target = np.bincount(sub_tenant, weights=per_tree[trees], minlength=len(S.tenant_table)).astype(np.int64)
    q = Quotas(per_tree[trees], size, sub_tenant, target, np.zeros(len(target), dtype=np.int64))
    res = compress(S, cfg, merger=merger, embedder=embedder, device=dev, progress=progress, on_round=on_round,
                   partition=part, quotas=q, budget=elements)
    return res, S_rows


def _splice_back(store, rows, W, f: _Trees, S_rows, res):
    """The whole store: W's rows that were not re-planned and the re-planned trees' output,
    each at its place among the untouched rows, with the trees and centres recorded."""
    keep_w = np.ones(len(W), dtype=bool)
    keep_w[S_rows] = False
    w_keep = np.flatnonzero(keep_w)
    parts, keys, trees = [W.take(w_keep)], [rows[w_keep]], [f.tree[w_keep]]
    ids = first_sources(W, f.centre)
    rad = f.radius.copy()
    if res is not None:
        S = W.take(S_rows)
        first = S_rows[first_rows(S, res.store)]  # the W row each output row takes the place of
        parts.append(res.store.to(W.device))
        keys.append(rows[first])
        trees.append(f.tree[first])
        rad = _replanned_radius(res.store, f.tree_start[W.tenant_codes_np[first]] + f.tree[first], ids, rad)
    untouched = np.ones(len(store), dtype=bool)
    untouched[rows] = False
    u_rows = np.flatnonzero(untouched)
    if len(u_rows):
        parts.insert(0, store.take(u_rows).to(W.device))
        keys.insert(0, u_rows)
        old = store.forest.tree[u_rows] if store.forest is not None else np.full(len(u_rows), -1, dtype=np.int64)
        trees.insert(0, old)
    all_keys = np.concatenate(keys)
    order = np.argsort(all_keys, kind="stable")
    states = dict(store.forest.tenants) if store.forest is not None else {}
    states.update(_states(W, f, ids, rad))
    out = splice(parts, keys, forest=Forest(np.concatenate(trees)[order], {}))
    out.forest.tenants = {t: states[t] for t in out.tenant_table if t in states}
    return out, all_keys[order]


def _replanned_radius(out: MemoryStore, gtree: np.ndarray, centre_ids: list[str], rad: np.ndarray) -> np.ndarray:
    """``rad`` with the radius of every re-planned tree computed again from its output rows
    (merged nodes have new vectors). Shape: gtree (len(out),) W's global trees -> (T,)"""
    T = len(rad)
    busy = np.zeros(T, dtype=bool)
    busy[gtree] = True
    trees = np.flatnonzero(busy)
    centre = np.full(T, -1, dtype=np.int64)
    centre[trees] = rows_of_originals(out, [centre_ids[t] for t in trees.tolist()])
    dev = out.device
    fresh = tree_radius(out.embeddings, torch.as_tensor(gtree, device=dev), torch.as_tensor(centre, device=dev),
                        torch.as_tensor(busy, device=dev)).cpu().numpy()
    return np.where(busy, fresh, rad)


def _states(W: MemoryStore, f: _Trees, ids: list[str], rad: np.ndarray) -> dict[str, TenantForest]:
    """Each compacted tenant's state: centres by original id, partition size, arrivals, radii."""
    n = np.bincount(W.tenant_codes_np, minlength=len(W.tenant_table))
    r32 = rad.astype(np.float32).tolist()
    out = {}
    for j, t in enumerate(W.tenant_table):
        s = f.states[t]
        lo, hi = f.tree_start[j], f.tree_start[j + 1]
        cen, r = ids[lo:hi], r32[lo:hi]
        if f.repartitioned[j]:
            out[t] = TenantForest(cen, int(n[j]), 0, f.key, r)
        else:
            out[t] = TenantForest(cen, s.partitioned, s.arrived + int(f.new[j]), s.config, r)
    return out
