"""``compact``: keep every tenant within its node limit as memories arrive, re-planning only
the trees that received memories or must shrink (docs/compaction.md).

    store ─over its limit?─▶ the tenants' rows W that are over their limit
      ├─ trees    each tenant's event trees (:mod:`.compacted_trees`): new rows placed into its
      │           recorded trees (:mod:`memforest_gpu.engine.placement`), or a full partition
      │           when it has none, was built with another config, or has doubled since
      │           (``repartition_growth``)
      ├─ quotas   exactly n - floor(low_water * max_nodes) per tenant, over the trees with the
      │           most excess (:mod:`.replan_quotas`)
      ├─ compress those trees only: :func:`~memforest_gpu.engine.compression.compress` with the
      │           ready Partition and Quotas
      └─ splice   the result back in place of its members (each merged node takes its earliest
                  member's row), trees and centres recorded

Tenants within their limit are not touched: only their counts are read. Every original stays in
exactly one node's ``sources``; the same store, config and merger give the same result.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ...config import CompactConfig, CompressConfig
from ...device import resolve_device
from ...renamed import renamed_keyword
from ...store.event_trees import EventTrees, TenantTrees
from ...store.memory_store import MemoryStore
from ...store.splice import splice
from ...timer import StageTimer
from ..compression import compress
from ..compression import dry_run as first_round
from ..memory import MemoryPlan
from ..output import CompressReport, MergeRecord, first_rows, first_sources, rows_of_originals
from ..partition import Partition, check_rules
from ..placement import tree_radius
from ..quotas import Quotas
from .compacted_trees import CompactedTrees, event_trees_of
from .replan_quotas import compaction_quotas

__all__ = ["compact", "CompactResult", "CompactReport", "check_keys_rule", "rule_differs", "keys_bound"]


@dataclass
class CompactReport:
    """What a compaction did: one dict per compacted tenant (``tenant``, ``nodes_in``,
    ``budget`` (its ``max_nodes``), ``keep``, ``nodes_out``, ``removed``, ``shortfall``,
    ``new``, ``placed``, ``new_trees``, ``trees``, ``trees_replanned``, ``repartitioned``)."""

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
    """``store``: the whole store afterwards (``store`` itself when no tenant was over its limit);
    ``keys`` (len(store),): the input row each output row stands at (a merged node: its
    earliest member's); ``work``: the rows of the tenants over their limit before the compaction
    (what ``merges`` and ``planned`` name; ``None`` when no tenant was over); ``planned``: a dry
    run's first-round pairs (``into=None``), when asked for with ``plan=True``."""

    store: MemoryStore
    report: CompactReport
    merges: list[MergeRecord]
    keys: np.ndarray
    work: MemoryStore | None = None
    planned: list[MergeRecord] = field(default_factory=list)


def compact(store: MemoryStore, limits: CompactConfig | None = None, config: CompressConfig | None = None, *,
            merger=None, embedder=None, device=None, progress: bool = False, on_round=None, dry_run: bool = False,
            tile_elements: int = 1 << 24, plan: bool = False, **renamed) -> CompactResult:
    """Compact every tenant of ``store`` that holds more than its limit (``limits``: the nodes
    each tenant may hold; ``budget=``: its old name) down to ``floor(low_water * max_nodes)``
    nodes (or report the shortfall); see the module docstring.

    ``config``: the compression (default ``CompressConfig()``); its partition fields are
    recorded with the trees. ``merger``, ``embedder``, ``device``, ``progress``, ``on_round``:
    as in :func:`~memforest_gpu.engine.compression.compress`. ``dry_run``: place and plan, merge
    nothing (the report says what would be removed where); with ``plan``, also the first round's
    pairs of the re-planned trees (``result.planned``, as
    :func:`~memforest_gpu.engine.compression.dry_run` finds them). ``tile_elements``: elements of
    one temporary tensor of the placement and the partition (as :class:`~..memory.MemoryPlan`'s).
    """
    limits = renamed_keyword("compact", renamed, "budget", "limits", limits)
    cfg = config or CompressConfig()
    if not isinstance(store, MemoryStore):
        raise ValueError(f"store must be a MemoryStore, got {type(store).__name__}")
    if not isinstance(limits, CompactConfig):
        raise ValueError(f"limits must be a CompactConfig, got {type(limits).__name__}")
    check_keys_rule(store, cfg.merge)
    timer = StageTimer()
    names = store.tenant_names()
    counts = np.bincount(store.tenant_codes_np, minlength=len(names))
    limit = np.array([limits.max_nodes_of(t) or 0 for t in names], dtype=np.int64)
    over = (limit > 0) & (counts > limit)
    rows = np.flatnonzero(over[store.tenant_codes_np])
    report = CompactReport([], len(store), len(store), len(names), dry_run=dry_run)
    if len(rows) == 0:
        report.seconds = timer.finish()
        return CompactResult(store, report, [], np.arange(len(store)))
    check_rules(store, cfg.merge.keep_pattern, cfg.merge.merge_within)  # a rule must select some of the nodes
    dev = resolve_device(device)
    W = store.take(rows).to(dev) if len(rows) < len(store) else store.to(dev)  # the tenants over their limit, in order
    timer.lap("select")
    f = event_trees_of(W, cfg, limits, tile_elements)
    timer.lap("place")
    per_tree, remove, short = compaction_quotas(f.size, f.originals, f.tree_tenant,
                                                np.array([limits.keep(t) for t in W.tenant_table]), f.touched,
                                                limits.slack)
    report.tenants = _rows(W, f, per_tree, remove, short, limits)
    if dry_run:
        planned = []
        if plan:
            with timer.stage("plan"):
                S_rows, S, part, q = _replan_inputs(W, f, per_tree, dev)
                if S is not None:
                    planned = first_round(S, cfg, embedder=embedder, device=dev, partition=part, quotas=q,
                                          memory=MemoryPlan.from_environment(tile_elements=tile_elements)).merges
        report.seconds = timer.finish()
        return CompactResult(store, report, [], np.arange(len(store)), W, planned)
    with timer.stage("compress"):
        res, S_rows, S = _replan(W, f, per_tree, cfg, merger, embedder, dev, progress, on_round, tile_elements)
    with timer.stage("splice"):
        out, keys = _splice_back(store, rows, W, f, S_rows, S, res)
    out.vector_codes = store.vector_codes  # the file keeps its vectors' codes (store/codes.py)
    report.seconds = timer.finish()
    report.nodes_out = len(out)
    if res is not None:
        report.engine, report.merges, report.rounds = res.report, res.report.merges, res.report.rounds
    left = dict(zip(out.tenant_table, np.bincount(out.tenant_codes_np, minlength=len(out.tenant_table)).tolist()))
    for r in report.tenants:  # what the merging reached (a node cap may stop it short)
        r["nodes_out"] = left[r["tenant"]]
        r["removed"] = r["nodes_in"] - r["nodes_out"]
        r["shortfall"] = max(0, r["nodes_out"] - limits.target(r["tenant"]))  # the target may be below keep
    return CompactResult(out, report, res.merges if res is not None else [], keys, W)


def check_keys_rule(store: MemoryStore, merge) -> None:
    """A store with keys is compacted under its own rule (every node's keys follow it): ``merge``'s
    ``keys`` and ``text_weight`` must equal the store's."""
    k = store.keys
    if k is None or not len(k.vectors):
        return
    if rule_differs(k.rule, merge):
        mk = merge.max_keys if merge.keys != 0 else 0
        raise ValueError(f"keys and text_weight must be the store's rule (keys {keys_bound(k.max_keys)}, text_weight "
                         f"{k.text_weight:g}) when compacting it, got keys {keys_bound(mk)}, text_weight "
                         f"{merge.text_weight:g}: its nodes' keys follow that rule; to change it, compress the "
                         f"store to a new file with the new keys and text_weight")


def rule_differs(rule: dict, merge) -> bool:
    """Whether ``merge``'s keys bound and text weight are not the keys' ``rule``
    (``{"text_weight": w, "max_keys": k}``)."""
    mk = merge.max_keys if merge.keys != 0 else 0
    return mk != rule["max_keys"] or float(merge.text_weight) != float(rule["text_weight"])


def keys_bound(max_keys) -> int | str:
    """A keys bound as the flag writes it (``all``: every source)."""
    return "all" if max_keys is None else max_keys


def _rows(W, f: CompactedTrees, per_tree, remove, short, limits: CompactConfig) -> list[dict]:
    """The plan per tenant (a dry run's report; the merging's outcome replaces nodes_out,
    removed and shortfall)."""
    names = W.tenant_table
    n = np.bincount(W.tenant_codes_np, minlength=len(names))
    trees = np.diff(f.tree_start)
    replanned = np.bincount(f.tree_tenant, weights=per_tree > 0, minlength=len(names)).astype(np.int64)
    return [{"tenant": t, "nodes_in": int(n[j]), "budget": limits.max_nodes_of(t), "keep": limits.keep(t),
             "nodes_out": int(n[j] - remove[j] + short[j]), "removed": int(remove[j] - short[j]),
             "shortfall": int(short[j]) + limits.keep(t) - limits.target(t), "new": int(f.new[j]),
             "placed": int(f.placed[j]),
             "new_trees": int(f.new_trees[j]), "trees": int(trees[j]), "trees_replanned": int(replanned[j]),
             "repartitioned": bool(f.repartitioned[j])} for j, t in enumerate(names)]


def _replan(W, f: CompactedTrees, per_tree, cfg, merger, embedder, dev, progress, on_round, tile_elements):
    """Compress the trees with a quota, as one sub-store with a ready partition and quotas."""
    S_rows, S, part, q = _replan_inputs(W, f, per_tree, dev)
    if S is None:
        return None, S_rows, None
    res = compress(S, cfg, merger=merger, embedder=embedder, device=dev, progress=progress, on_round=on_round,
                   partition=part, quotas=q, memory=MemoryPlan.from_environment(tile_elements=tile_elements))
    return res, S_rows, S


def _replan_inputs(W, f: CompactedTrees, per_tree, dev):
    """The trees with a quota as one sub-store (its rows of ``W``), with its partition and
    quotas."""
    T = len(per_tree)
    g = f.tree_start[W.tenant_codes_np] + f.tree
    busy = per_tree > 0
    S_rows = np.flatnonzero(busy[g])
    if len(S_rows) == 0:
        return S_rows, None, None, None
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
    return S_rows, S, part, q


def _splice_back(store, rows, W, f: CompactedTrees, S_rows, S, res):
    """The whole store: W's rows that were not re-planned and the re-planned trees' output,
    each at its place among the untouched rows, with the trees and centres recorded."""
    keep_w = np.ones(len(W), dtype=bool)
    keep_w[S_rows] = False
    w_keep = np.flatnonzero(keep_w)
    parts, sel, keys, trees = [W], [w_keep], [rows[w_keep]], [f.tree[w_keep]]
    ids = first_sources(W, f.centre)
    rad = f.radius.copy()
    if res is not None:
        first = S_rows[first_rows(S, res.store)]  # the W row each output row takes the place of
        parts.append(res.store.to(W.device))
        sel.append(None)
        keys.append(rows[first])
        trees.append(f.tree[first])
        rad = _replanned_radius(res.store, f.tree_start[W.tenant_codes_np[first]] + f.tree[first], ids, rad)
    untouched = np.ones(len(store), dtype=bool)
    untouched[rows] = False
    u_rows = np.flatnonzero(untouched)
    if len(u_rows):
        parts.insert(0, store if store.device == W.device else store.to(W.device))
        sel.insert(0, u_rows)
        keys.insert(0, u_rows)
        trees.insert(0, store.event_trees.tree[u_rows] if store.event_trees is not None else np.full(len(u_rows), -1))
    all_keys = np.concatenate(keys)
    order = np.argsort(all_keys, kind="stable")
    states = dict(store.event_trees.tenants) if store.event_trees is not None else {}
    states.update(_states(W, f, ids, rad))
    out = splice(parts, keys, rows=sel, event_trees=EventTrees(np.concatenate(trees).astype(np.int64)[order], {}))
    out.event_trees.tenants = {t: states[t] for t in out.tenant_table if t in states}
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


def _states(W: MemoryStore, f: CompactedTrees, ids: list[str], rad: np.ndarray) -> dict[str, TenantTrees]:
    """Each compacted tenant's state: centres by original id, partition size, arrivals, radii."""
    n = np.bincount(W.tenant_codes_np, minlength=len(W.tenant_table))
    r32 = rad.astype(np.float32).tolist()
    out = {}
    for j, t in enumerate(W.tenant_table):
        s = f.states[t]
        lo, hi = f.tree_start[j], f.tree_start[j + 1]
        cen, r = ids[lo:hi], r32[lo:hi]
        if f.repartitioned[j]:
            out[t] = TenantTrees(cen, int(n[j]), 0, f.key, r)
        else:
            out[t] = TenantTrees(cen, s.partitioned, s.arrived + int(f.new[j]), s.config, r)
    return out
