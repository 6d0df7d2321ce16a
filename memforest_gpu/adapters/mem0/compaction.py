"""Keep every user of a Mem0 store within its node limit: ``memforest mem0 compact``.

    res = compact_mem0(memory, CompactConfig(max_nodes=500), state="mem0.compact.json")

What :func:`compact_mem0` does, in order:

1. reads every memory of the scope (default: the whole collection) with its vector;
2. counts each tenant's memories (a tenant is a Mem0 scope: ``user_id`` / ``agent_id`` /
   ``run_id`` / ``actor_id``; memories with an ``expiration_date`` and procedural ones are
   left alone and not counted); tenants within their limit are done with;
3. compacts the tenants over their limit with :func:`~memforest_gpu.engine.compaction.compact`:
   their memories added since the last compaction are placed into their event trees, read from
   the state file (``state``: memory id -> tree, and each tenant's centres; a memory the file
   does not know is new), and only the trees that received memories or must shrink are
   re-planned; merged text is embedded with Mem0's own model;
4. (dry run: stops here and returns the plan)
5. writes it back as ``mem0 compress`` does (:func:`~.inplace.write_back`): a backup of the whole
   scope, the merged memories added through Mem0 (``metadata.merged_from``: the originals),
   verified by reading them back from the vector store by id in batches, relinked to Mem0's
   entities, and only then the memories they replace deleted;
6. writes the state file (atomically).

A failure before step 5's deletions leaves every original in place, and ``memforest mem0
restore BACKUP`` puts the scope back. A state file that is stale (a run stopped before step 6)
only makes the next compaction place the memories it does not know as new ones.
"""
from __future__ import annotations

import json
import os

import numpy as np

from ...config import CompactConfig, CompressConfig
from ...engine.compaction import compact
from ...renamed import renamed_keyword
from ...store.atomic import atomic_write_text
from ...store.event_trees import EventTrees, event_trees_from_json, event_trees_json
from ...timer import StageTimer
from .inplace import (
    Mem0CompressResult,
    Mem0Embedder,
    Scope,
    check_dimension,
    check_write_path,
    merge_groups,
    single_vector,
    split_eligible,
    store_of_points,
    tenant_of,
    write_back,
)
from .vectors import read_points

__all__ = ["compact_mem0", "read_state", "write_state", "STATE_VERSION"]

STATE_VERSION = 1


def read_state(path) -> tuple[dict[str, int], dict]:
    """(memory id -> tree, tenant -> TenantTrees) from a state file; empty when there is none."""
    if path is None or not os.path.exists(path):
        return {}, {}
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
        if d.get("version") != STATE_VERSION:
            return {}, {}
        return {str(k): int(v) for k, v in d["trees"].items()}, event_trees_from_json(json.dumps(d["forest"]), path)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{path}: not a memforest Mem0 compaction state: {e}") from None


def write_state(path, trees: dict[str, int], states: dict) -> None:
    trees_json = json.loads(event_trees_json(EventTrees(np.zeros(0, dtype=np.int64), states), list(states)))
    atomic_write_text(path, json.dumps({"version": STATE_VERSION, "forest": trees_json, "trees": trees},
                                       separators=(",", ":")))


def compact_mem0(memory, limits: CompactConfig | None = None, config: CompressConfig | None = None, *,
                 scope: Scope | None = None, state=None, merger=None, backup=None, dry_run: bool = False, device=None,
                 progress: bool = False, after_write=None, write_path: str = "batch", plan: bool = False,
                 **renamed) -> Mem0CompressResult:
    """Compact every tenant of ``scope`` over its limit (see the module docstring).
    ``state``: the state file (``None``: none; every compacted tenant is then partitioned in
    full). ``write_path`` as in :func:`~.inplace.compress_mem0`. The result's ``report`` is the
    :class:`~memforest_gpu.engine.compaction.CompactReport`. ``plan``: a dry run also plans its
    first round (``result.merges``, ``result.planned``: for a review page). ``limits``: the
    nodes each tenant may hold (``budget=``: its old name)."""
    limits = renamed_keyword("compact_mem0", renamed, "budget", "limits", limits)
    if limits is None:
        raise TypeError("compact_mem0() missing its limits (a CompactConfig)")
    check_write_path(write_path, config)
    scope = scope or Scope(all_tenants=True)
    clock = StageTimer()
    points = read_points(memory, scope.filters)
    clock.lap("read")
    todo, result = split_eligible(points, scope, dry_run, clock)
    counts: dict[str, int] = {}
    for p in todo:
        t = tenant_of(p.payload)
        counts[t] = counts.get(t, 0) + 1
    over = {t for t, c in counts.items() if (limits.max_nodes_of(t) or 0) and c > limits.max_nodes_of(t)}
    todo = [p for p in todo if tenant_of(p.payload) in over]
    if not todo:
        return result
    trees, states = read_state(state)
    emb = Mem0Embedder(memory, device=device)
    check_dimension(memory, todo[0].vector.shape[0], {"the embedder's vectors": emb.dim})
    store = store_of_points(todo, emb.name)
    store.event_trees = EventTrees(np.array([trees.get(p.id, -1) for p in todo], dtype=np.int64),
                          {t: s for t, s in states.items() if t in over})
    res = compact(store, limits, single_vector(config), merger=merger, embedder=emb, device=device, progress=progress,
                  dry_run=dry_run, plan=plan and dry_run)
    clock.lap("compact")
    result.report = res.report
    result.work = store
    result.merges, result.planned = (res.planned, True) if dry_run else (res.merges, False)
    by_id = {p.id: p for p in todo}
    result.groups, vectors, rows = merge_groups(store, res.store, res.merges, by_id)
    if dry_run:
        return result
    if result.groups:
        write_back(memory, result, points, by_id, vectors, backup, after_write, clock, write_path=write_path)
    if state is not None:
        _save_state(state, trees, states, res.store, result.groups, rows, over, {p.id for p in points})
        clock.lap("state")
    return result


def _save_state(path, trees: dict, states: dict, out, groups, rows: list[int], over: set, present: set) -> None:
    """The compacted tenants' trees (memory ids as Mem0 stores them now) and states, with
    every other tenant's as they were (memories no longer in the store dropped)."""
    new_id = dict(zip(rows, (g.new_id for g in groups)))
    mine = set(out.ids)
    keep = {i: t for i, t in trees.items() if i in present and i not in mine}  # tenants not compacted
    for j, (i, t) in enumerate(zip(out.ids, out.event_trees.tree.tolist())):
        keep[new_id.get(j, i)] = int(t)
    states = {t: s for t, s in states.items() if t not in over}
    states.update(out.event_trees.tenants)
    write_state(path, keep, states)
