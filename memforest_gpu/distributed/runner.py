"""Compress one store on all ranks of a torch.distributed group; every rank gets the result.

Tenants never interact (docs/method.md: every stage runs per tenant, with per-tenant random
streams), so a rank that compresses a subset of whole tenants produces exactly the rows
the single-process run produces for them. Work is therefore handed out as

- whole tenants, balanced over ranks by cost (n^2), and
- for a tenant too large for one rank: its EventTrees, computed by all ranks together
  (:func:`.kmeans.partition_tenant`), then whole trees balanced over ranks. Each tree
  loses the share the single-process run gives it (round(ratio * n_t) split over the
  tenant's trees by largest remainder).

Rank 0 of the caller writes the gathered store; its rows are put in the single-process
order (by the earliest original each node holds).

A rank merges its trees of split tenants with one ``compress`` call that is handed their
partition and quotas (the engine computes neither). This matches the single-process
result except when a tree cannot reach its quota (``max_node_tokens``): the
single-process engine then hands the rest to another tree of the tenant, which may be on
another rank here, and the tenant reports a shortfall instead.
"""
from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from ..config import CompressConfig
from ..device import resolve_device
from ..engine import MergeRecord
from ..engine.partition import Partition, n_clusters
from ..engine.quotas import Quotas, allocate, removal_target
from ..mergers.embedders import MEAN_EMBEDDER
from ..report import CompressReport, combine_iterations
from ..runs.driver import MergerRun
from ..store.keys import NodeKeys
from ..store.memory_store import MemoryStore
from ..timer import StageTimer
from .kmeans import partition_tenant
from .ranks import all_ranks, world_of
from .workload import WorkItem, balance, tenants_to_split

__all__ = ["compress_distributed", "DistributedResult"]

log = logging.getLogger("memforest_gpu")

@dataclass
class DistributedResult:
    store: MemoryStore
    report: CompressReport
    merges: list[tuple[int, MergeRecord]]  # every rank's merge log: (rank, record)
    plan: list[list[dict]] = field(default_factory=list)  # per rank: the work items it did
    split: list[str] = field(default_factory=list)  # tenants whose trees were spread over ranks
    replayed: int = 0  # merges every rank took from its journal (a resumed run), not from its merger


def _tree_work(store: MemoryStore, keys: list[tuple[str, int]], tree_rows: dict, quota: dict, device):
    """This rank's trees of split tenants as one store with its ready partition and quotas:
    trees numbered tenant-major (the engine's order), each with the quota the
    single-process allocation gave it."""
    rows = sorted(i for key in keys for i in tree_rows[key])
    sub = store.take(rows)
    names, codes = sub.tenant_index()
    code_of = {n: j for j, n in enumerate(names)}
    keys = sorted(keys, key=lambda k: (code_of[k[0]], k[1]))
    pos = {r: j for j, r in enumerate(rows)}
    tree = np.empty(len(rows), dtype=np.int64)
    for t_id, key in enumerate(keys):
        tree[[pos[r] for r in tree_rows[key]]] = t_id
    dev = resolve_device(device)
    tree_t = torch.as_tensor(tree, device=dev)
    tree_tenant = np.array([code_of[t] for t, _ in keys], dtype=np.int64)
    part = Partition(tree_t, torch.as_tensor(tree_tenant, device=dev),
                     torch.full((len(keys),), -1, dtype=torch.int64, device=dev), tree_t, {}, 0)
    size = np.bincount(tree, minlength=len(keys)).astype(np.int64)
    per_tree = np.array([quota[k] for k in keys], dtype=np.int64)
    target = np.bincount(tree_tenant, weights=per_tree, minlength=len(names)).astype(np.int64)
    return sub, part, Quotas(per_tree, size, tree_tenant, target, np.zeros(len(names), dtype=np.int64))


def _splittable(cfg: CompressConfig, n: int) -> bool:
    """Whether a tenant's trees may be spread over ranks; a tenant under the keep rule or merge
    groups goes whole to one rank, whose ``compress`` applies them."""
    p = cfg.partition
    two_level = getattr(p, "kmeans", "exact") == "two-level" and n >= getattr(p, "two_level_min_nodes", n + 1)
    ruled = cfg.merge.keep_pattern is not None or cfg.merge.merge_within is not None
    return not two_level and cfg.spanning.kind != "random" and not ruled


def compress_distributed(store: MemoryStore, config: CompressConfig | None = None, *,
                         merger_factory: Callable[[], object] | None = None, embedder=None, device=None,
                         split_above: int | None = None, group=None, progress: bool = False,
                         run: MergerRun | None = None) -> DistributedResult | None:
    """Compress ``store`` with every rank of ``group`` (all ranks pass the same store and
    config; each its own merger, from ``merger_factory``, and embedder). Without an
    initialised process group this is a one-rank run of the same code. Returns the result
    on rank 0 (the only rank that holds the whole output) and ``None`` on the others.

    ``split_above``: tenants with more nodes than this have their trees spread over ranks;
    ``None``: tenants whose n^2 cost alone exceeds total / world_size.

    ``run``: this rank's merger behind its journal (:class:`~memforest_gpu.runs.driver.MergerRun`,
    made by :func:`~.files.compress_file_distributed`; ``merger_factory`` is then unused). As in
    a single run, a merger that failed on every request of a round stops the run
    (:class:`~memforest_gpu.runs.driver.MergerFailedError`); a rank's failure stops every
    rank (:class:`~.ranks.RankFailedError` on the others).
    """
    cfg = config or CompressConfig()
    rank, world = world_of(group)
    timer = StageTimer()
    names, codes = store.tenant_index()
    codes = codes.cpu().numpy()
    counts = np.bincount(codes, minlength=len(names))
    grouped = np.argsort(codes, kind="stable")  # rows by tenant, store order inside
    rows_of: dict[str, np.ndarray] = dict(zip(names, np.split(grouped, np.cumsum(counts)[:-1])))
    sizes = dict(zip(names, counts.tolist()))
    split = [t for t in tenants_to_split(sizes, world, split_above) if _splittable(cfg, sizes[t])]
    items, tree_rows, quota, split_part = _work_items(store, cfg, names, sizes, rows_of, split, group)
    plan = balance(items, world)
    mine = plan[rank]

    if run is None:
        run = MergerRun(None, None, cfg, merger_factory() if merger_factory is not None and mine else None,
                        journal=False)
    results = all_ranks(lambda: _compress_mine(store, cfg, mine, rows_of, (tree_rows, quota), run, embedder,
                                               device, progress), group)
    mine_info = _rank_info(store, results, rank, timer)
    mine_info["replayed"] = run.replayed()
    if world > 1:
        gathered: list | None = [None] * world if rank == 0 else None
        dist.gather_object(mine_info, gathered, dst=0, group=group)
        if rank != 0:
            return None
    else:
        gathered = [mine_info]
    res = _assemble(store, gathered, plan, split, names, split_part, timer.finish()["total"])
    res.store.vector_codes = cfg.merge.vectors  # its file holds the vectors as a single run's does
    res.store.time_format = store.time_format  # and its timestamps as the input did
    return res


def _compress_mine(store, cfg, mine: list[WorkItem], rows_of, trees, run: MergerRun, embedder, device,
                   progress) -> list:
    """This rank's work: its whole tenants with one ``compress`` call, its trees of split
    tenants (``trees``: rows and quota of each (tenant, tree)) with another."""
    tree_rows, quota = trees
    whole = [rows_of[it.tenant] for it in mine if it.tree is None]
    whole = np.sort(np.concatenate(whole)).tolist() if whole else []
    mine_trees = [(it.tenant, it.tree) for it in mine if it.tree is not None]
    results = []
    if whole:
        results.append(run.compress(store.take(whole), embedder, device=device, progress=progress))
    if mine_trees:
        sub, part, q = _tree_work(store, mine_trees, tree_rows, quota, device)
        results.append(run.compress(sub, embedder, device=device, progress=progress, partition=part, quotas=q))
    return results


def _work_items(store: MemoryStore, cfg: CompressConfig, names: list[str], sizes: dict[str, int],
                rows_of: dict[str, np.ndarray], split: list[str], group):
    """The run's work items: every tenant not split whole, and each tree of a split tenant
    (its trees computed by all ranks together, its quota split over them). Returns (items,
    rows of each (tenant, tree), quota of each (tenant, tree), the split tenants' partition
    figures as a report)."""
    items = [WorkItem(t, sizes[t]) for t in names if t not in split]
    tree_rows: dict[tuple[str, int], list[int]] = {}
    quota: dict[tuple[str, int], int] = {}
    iterations, moved = [], 0
    for t in split:
        rows = torch.as_tensor(rows_of[t], dtype=torch.int64, device=store.device)
        tree, it, mv = partition_tenant(store.embeddings[rows], store.timestamps[rows], t, cfg.partition,
                                        group=group)
        # the engine's key: a k-means bucket, or the closed form of a tenant of one cluster
        iterations.append({f"n<={sizes[t]}": it} if n_clusters(sizes[t], cfg.partition.alpha) >= 2
                          else {"K=1 closed form": 0})
        moved += mv
        tree = tree.cpu().numpy()
        ids = np.unique(tree)  # the engine's tree order inside a tenant
        size = np.array([(tree == c).sum() for c in ids], dtype=np.int64)
        q = allocate(removal_target(sizes[t], cfg.merge.ratio), size, size - 1)
        for c, s, qq in zip(ids.tolist(), size.tolist(), q.tolist()):
            tree_rows[(t, c)] = rows_of[t][tree == c].tolist()
            quota[(t, c)] = qq
            items.append(WorkItem(t, s, tree=c))
    return items, tree_rows, quota, _partition_report(cfg, iterations, moved)


def _partition_report(cfg: CompressConfig, iterations: list[dict], moved: int) -> CompressReport:
    """The split tenants' partition (computed by all ranks together) as a report part: no
    tenant rows, its k-means iterations and the nodes its reassignment moved."""
    return CompressReport([], 0, 0, 0, 0, 0, cfg.merge.schedule, "none", MEAN_EMBEDDER, None,
                          moved_by_reassignment=moved, kmeans_iterations=combine_iterations(iterations))


def _rank_info(store: MemoryStore, results: list, rank: int, timer: StageTimer) -> dict:
    """What this rank sends to rank 0: its output rows (each with the input row of its
    earliest original, the single-process output order), its merges and its reports."""
    lens = np.fromiter(map(len, store.sources), dtype=np.int64, count=len(store))
    first_of = dict(zip(itertools.chain.from_iterable(store.sources), np.repeat(np.arange(len(store)), lens).tolist()))
    chunks = []
    for out in (res.store for res in results):
        chunks.append({"first": [min(first_of[s] for s in src) for src in out.sources], "ids": out.ids,
                       "texts": out.texts, "emb": out.embeddings.detach().cpu(),
                       "ts": out.timestamps.detach().cpu(), "tenants": out.tenants,
                       "sources": out.sources, "metadata": out.metadata,
                       "keys": out.keys.to("cpu") if out.keys is not None else None})
    return {"chunks": chunks, "merges": [(rank, m) for res in results for m in res.merges],
            "reports": [res.report for res in results], "seconds": timer.finish()["total"]}


def _assemble(store, gathered, plan, split, names, split_part, seconds) -> DistributedResult:
    chunks = [c for g in gathered for c in g["chunks"]]
    first = np.array([f for c in chunks for f in c["first"]], dtype=np.int64)
    order = np.argsort(first, kind="stable").tolist()

    def col(key):
        flat = [x for c in chunks for x in c[key]]
        return [flat[i] for i in order]

    dev = store.device
    o = torch.as_tensor(order, dtype=torch.int64)
    emb = torch.cat([c["emb"] for c in chunks])[o].to(dev) if chunks else store.embeddings[:0]
    ts = torch.cat([c["ts"] for c in chunks])[o].to(dev) if chunks else store.timestamps[:0]
    keys = NodeKeys.concat([c.get("keys") for c in chunks], [len(c["ids"]) for c in chunks], store.dim, dev)
    out = MemoryStore(col("ids"), col("texts"), emb, ts, col("tenants"), [list(s) for s in col("sources")],
                      [dict(m) for m in col("metadata")], store.embedder,
                      keys=keys.take(np.asarray(order, dtype=np.int64)) if keys is not None else None)
    merges = [m for g in gathered for m in g["merges"]]  # (rank, MergeRecord)
    replayed = sum(g["replayed"] for g in gathered)
    parts = [r for g in gathered for r in g["reports"]] + [split_part]
    report = CompressReport.combine(parts, order=names, seconds={
        "total": seconds, **{f"rank{r}": g["seconds"] for r, g in enumerate(gathered)}})
    plan_d = [[{"tenant": it.tenant, "tree": it.tree, "nodes": it.size} for it in p] for p in plan]
    return DistributedResult(out, report, merges, plan_d, split, replayed)
