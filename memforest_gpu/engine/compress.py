"""MemForest compression (SPEC sections 1-3): the stages wired together.

    store ─partition_nodes()─▶ Partition ─removal_quotas()─▶ Quotas ─build_trees()─▶ TreeBatch
    per round:  plan_round() ─▶ Plan ─▶ merge_round() (one merger call) ─▶ embedder / pair_means
                ─▶ apply_round() (device tensors)  +  NodeTable (host bookkeeping)
    at the end: assemble() ─▶ MemoryStore

Each stage is a function in its own module; :func:`compress` only wires them, and owns
progress, timing and the report (:mod:`.result`). :func:`~.dry_run.dry_run` takes the same
setup (:func:`setup_run`) and plans the first round only.
The host reads a constant number of device values per round (the plan), whatever the
number of trees, pairs and tenants (:mod:`memforest_gpu.engine.host_reads` counts them).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ..config import CompressConfig
from ..device import resolve_device
from ..store.memory_store import MemoryStore
from .apply import apply_round, pair_means
from .assemble import assemble
from .constraints import constrain
from .forest import record_forest, with_centres
from .merge_call import cap_and_counter, count_column, merge_round_capped, with_fallback
from .node_table import NodeTable
from .partition import Partition, partition_nodes
from .plan import Plan, plan_round
from .quotas import Quotas, redistribute, removal_quotas
from .records import MergeRecord
from .result import CompressReport, CompressResult
from .trees import TreeBatch, build_trees

__all__ = ["compress", "setup_run", "RunSetup", "older_first", "merge_records", "run_report"]


@dataclass
class RunSetup:
    cfg: CompressConfig
    names: list[str]
    part: Partition
    quotas: Quotas
    batch: TreeBatch
    table: NodeTable
    emb: torch.Tensor
    cap: int | None
    counter: Callable | None
    times: dict
    kept: np.ndarray | None = None  # (n_tenants,) nodes the keep rule holds out of merging

    @property
    def plan_cap(self) -> int | None:
        """The cap the planner excludes pairs by: ``strict`` only (``condense`` merges any pair
        and cuts the text to the cap)."""
        return self.cap if self.cfg.merge.cap_policy == "strict" else None


def compress(store: MemoryStore, config: CompressConfig | None = None, *, merger=None, embedder=None,
             device=None, progress: bool = False, on_round: Callable[[int, list[MergeRecord]], None] | None = None,
             partition: Partition | None = None, quotas: Quotas | None = None, budget: int = 1 << 24,
             copy: bool = True) -> CompressResult:
    """Compress ``store`` with MemForest.

    Args:
        config: stage configs (defaults: SPEC).
        merger: any :class:`~memforest_gpu.mergers.Merger`; default the extractive merger.
        embedder: re-embeds merged text (``None``: normalised mean of the two inputs).
        device: where the tensor work runs (``None``: CUDA when present).
        progress: show progress bars.
        on_round: called after each round with (round, the round's merge records).
        partition, quotas: a ready partition of ``store`` (and its quotas) instead of
            computing them (the distributed runner hands each rank its trees this way).
        copy: ``False`` lets the output's vectors overwrite ``store.embeddings`` (then a view of
            its first rows): no second (N_out, D) tensor, for callers that drop ``store`` after,
            as ``compress_file`` does. A run on another device writes into its own copy anyway.

    Every tenant loses exactly ``round(ratio * N_t)`` nodes unless it cannot (report's
    ``shortfall``); every original id ends in exactly one output node's ``sources``.
    """
    s = setup_run(store, config, embedder, device, progress, partition, quotas, budget)
    merger, fallback = with_fallback(merger)
    q, batch, table, times = s.quotas, s.batch, s.table, s.times
    remaining, count = q.per_tree.copy(), q.tree_size.copy()
    stuck, shortfall = np.zeros(len(count), dtype=bool), q.shortfall.copy()
    rng = np.random.default_rng(s.cfg.merge.seed)
    records: list[MergeRecord] = []
    vectors: list[torch.Tensor] = []  # merged nodes' vectors, one (P, D) block per round
    consumed: list[np.ndarray] = []  # rows merged away, one block per round
    rounds = fallbacks = condensed = condensed_tokens = 0
    bar = _bar(progress, q.total, "merging")
    while (need := (remaining > 0) & ~stuck & (count >= 2)).any():
        t = time.perf_counter()
        p = plan_round(batch, need, remaining, s.cfg, s.plan_cap, rng)
        got = np.bincount(p.tree_np, minlength=len(count))
        stuck |= need & (got == 0)  # no eligible edge left (node cap): hand the rest over
        redistribute(stuck, remaining, count, q.tree_tenant, shortfall)
        times["trees"] += time.perf_counter() - t
        if not len(p):
            continue
        rounds += 1
        t = time.perf_counter()
        older, newer = older_first(table, p)
        texts, tokens, nfb, dropped = merge_round_capped(
            merger, fallback, table.merge_pairs(older, newer), counter=s.counter, cap=s.cap,
            cap_policy=s.cfg.merge.cap_policy)
        fallbacks += nfb
        condensed, condensed_tokens = condensed + sum(d > 0 for d in dropped), condensed_tokens + sum(dropped)
        times["merge"] += time.perf_counter() - t
        t = time.perf_counter()
        vec = embedder.embed(texts).to(s.emb.device, torch.float32) if embedder is not None else pair_means(batch, p)
        times["embed"] += time.perf_counter() - t
        t = time.perf_counter()
        new = np.array([table.add(a, b, text) for a, b, text in zip(older, newer, texts)], dtype=np.int64)
        apply_round(batch, p, vec, new, None if tokens is None else torch.tensor(tokens, dtype=torch.int64))
        vectors.append(vec)
        consumed += [older, newer]
        remaining -= got
        count -= got
        done = merge_records(table, rounds, older, newer, p.similarity, new)
        records += done
        times["trees"] += time.perf_counter() - t
        if on_round is not None:
            on_round(rounds, done)
        if bar:
            bar.update(len(p))
    if bar:
        bar.close()
    t = time.perf_counter()
    batch = s.batch = None  # the padded tree tensors (about 2x the embeddings) are not needed any more
    out = _output(s, store, table, consumed, vectors, copy, record=partition is None)
    times["output"] = time.perf_counter() - t
    times["total"] = time.perf_counter() - times.pop("_t0")
    report = run_report(s, store, merger, embedder, out, shortfall, rounds, len(records), fallbacks)
    report.condensed, report.condensed_tokens = condensed, condensed_tokens
    return CompressResult(out, report, records)


# --------------------------------------------------------------------------- helpers
def _output(s: RunSetup, store: MemoryStore, table: NodeTable, consumed: list[np.ndarray],
            vectors: list[torch.Tensor], copy: bool, record: bool) -> MemoryStore:
    """The live rows as the output store. The merged vectors' blocks are released as they are
    read; the output's vectors overwrite the run's own (``s.emb``) unless they are the caller's
    store's and ``copy``. ``record``: the run made its own full partition, recorded as the
    output's forest so that ``compact`` can place new memories into its trees later."""
    live = np.ones(len(table), dtype=bool)
    live[np.concatenate(consumed) if consumed else np.zeros(0, dtype=np.int64)] = False
    if record:  # centres first: the output may overwrite the input's vectors
        tree = s.part.tree.cpu().numpy()
        centre = with_centres(store, tree, s.part.centre.cpu().numpy())
    out = assemble(table, live, s.emb, vectors, in_place=not copy or s.emb is not store.embeddings)
    if record:
        record_forest(out, store, tree, s.part.tree_tenant.cpu().numpy(), centre, np.sort(table.first[live]),
                      s.names, s.cfg.partition)
    return out


def setup_run(store, config, embedder, device, progress, part, q, budget) -> RunSetup:
    """Validate, then partition, quotas and trees (or take the given ones)."""
    t0 = time.perf_counter()
    cfg = config or CompressConfig()
    if not isinstance(cfg, CompressConfig):
        raise ValueError(f"config must be a CompressConfig, got {type(cfg).__name__}")
    if not isinstance(store, MemoryStore):
        raise ValueError(f"store must be a MemoryStore, got {type(store).__name__}")
    if embedder is not None and embedder.dim != store.dim:
        raise ValueError(
            f"embedder dimension must match the store's ({store.dim}), got {embedder.dim} from {embedder.name!r}; "
            "use the model that made the store's vectors, or no embedder (mean of the two vectors)")
    dev = resolve_device(device)
    emb, ts = store.embeddings.to(dev), store.timestamps.to(dev)
    names, codes = store.tenant_index()
    codes = codes.to(dev)
    times = {"_t0": t0, "trees": 0.0, "merge": 0.0, "embed": 0.0}
    if part is None:
        bar = _bar(progress, len(store), "partition")
        part = partition_nodes(emb, ts, codes, names, cfg.partition, budget=budget,
                         progress=(lambda n: bar.update(n)) if bar else None)
        if bar:
            bar.close()
    else:
        _check_partition(part, len(store), len(names))
    part, kept = constrain(part, store, cfg.merge.keep_pattern, cfg.merge.merge_within)  # who may merge
    times["partition"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    n_trees = int(part.tree_tenant.shape[0])
    tree_size = torch.bincount(part.tree, minlength=n_trees).cpu().numpy().astype(np.int64)
    if q is None:
        tenant_size = np.bincount(codes.cpu().numpy(), minlength=len(names))
        q = removal_quotas(tree_size, part.tree_tenant.cpu().numpy(), tenant_size - kept, cfg.merge.ratio)
    elif len(q.per_tree) != n_trees or not np.array_equal(q.tree_size, tree_size):
        raise ValueError(f"quotas must be for the partition's {n_trees} trees of sizes {tree_size.tolist()[:8]}..., "
                         f"got {len(q.per_tree)} trees")
    # the size term needs lengths too
    cap, counter = cap_and_counter(cfg.merge.max_node_tokens, embedder, count=cfg.tree.size_weight > 0)
    tokens = torch.as_tensor(count_column(counter, store.texts)).to(dev) if counter is not None else None
    batch = build_trees(part.tree, tree_size, emb, ts, codes, tokens, dtype=getattr(torch, cfg.storage_dtype),
                        config=cfg.tree, cap=cap if cfg.merge.cap_policy == "strict" else None)
    times["setup"] = time.perf_counter() - t1
    return RunSetup(cfg, names, part, q, batch, NodeTable(store), emb, cap, counter, times, kept)


def _check_partition(part: Partition, n: int, n_tenants: int) -> None:
    if not isinstance(part, Partition):
        raise ValueError(f"partition must be a Partition, got {type(part).__name__}")
    if tuple(part.tree.shape) != (n,):
        raise ValueError(f"partition.tree must have one tree id per node ({n},), got shape {tuple(part.tree.shape)}")
    T = int(part.tree_tenant.shape[0])
    tt = part.tree_tenant.cpu()
    if n and (int(part.tree.min()) < 0 or int(part.tree.max()) >= T):
        raise ValueError(f"partition.tree must hold tree ids in [0, {T}), got {int(part.tree.min())}..{int(part.tree.max())}")
    if T and (bool((tt[1:] < tt[:-1]).any()) or int(tt.min()) < 0 or int(tt.max()) >= n_tenants):
        raise ValueError(f"partition.tree_tenant must be sorted tenant codes in [0, {n_tenants})")


def older_first(table: NodeTable, p: Plan) -> tuple[np.ndarray, np.ndarray]:
    """Each planned pair as (older, newer) rows: the merger's order."""
    return table.order_many(p.node_a, p.node_b)


def merge_records(table: NodeTable, rnd: int, older: np.ndarray, newer: np.ndarray, sims, new: np.ndarray | None = None
             ) -> list[MergeRecord]:
    """One MergeRecord per pair (a dry run's have no ``into`` / ``text``); the merged text is
    the table's own string, not a copy."""
    ten, ia, ib = table.tenant_of(older), table.ids_of(older), table.ids_of(newer)
    w = np.asarray(sims, dtype=np.float64).tolist()
    if new is None:
        return [MergeRecord(rnd, ten[k], ia[k], ib[k], w[k]) for k in range(len(ia))]
    into, text = table.ids_of(new), table.texts_of(new)
    return [MergeRecord(rnd, ten[k], ia[k], ib[k], w[k], into[k], text[k]) for k in range(len(ia))]


def run_report(s: RunSetup, store, merger, embedder, out, shortfall, rounds, merges, fallbacks) -> CompressReport:
    """The run's report; a dry run (no merger) has no per-tenant rows."""
    q = s.quotas
    rows = []
    if merger is not None:
        n_ten = len(s.names)
        n_in = np.bincount(q.tree_tenant, weights=q.tree_size, minlength=n_ten).astype(np.int64)
        n_trees = np.bincount(q.tree_tenant, minlength=n_ten)
        out_names, out_codes = out.tenant_index()  # the output's own codes -> the run's codes
        code = {t: j for j, t in enumerate(s.names)}
        to_run = np.array([code[t] for t in out_names], dtype=np.int64)
        n_out = np.bincount(to_run[out_codes.cpu().numpy()], minlength=n_ten).astype(np.int64) \
            if len(out_names) else np.zeros(n_ten, dtype=np.int64)
        removed = n_in - n_out
        ratio = np.divide(removed, n_in, out=np.zeros(n_ten), where=n_in > 0)
        kept = s.kept if s.kept is not None else np.zeros(n_ten, dtype=np.int64)
        rows = [{"tenant": name, "nodes_in": n, "nodes_out": o, "requested": r, "removed": d, "ratio": f,
                 "shortfall": sf, "trees": tr, "kept": k}
                for name, n, o, r, d, f, sf, tr, k in zip(s.names, n_in.tolist(), n_out.tolist(), q.target.tolist(),
                                                          removed.tolist(), ratio.tolist(), shortfall.tolist(),
                                                          n_trees.tolist(), kept.tolist())]
    return CompressReport(
        tenants=rows, nodes_in=len(store), nodes_out=len(out), trees=len(q.per_tree), rounds=rounds, merges=merges,
        schedule=s.cfg.merge.schedule, merger=getattr(merger, "name", type(merger).__name__) if merger else "none",
        embedder=embedder.name if embedder is not None else "mean-of-inputs", max_node_tokens=s.cap,
        seconds=s.times, fallbacks=fallbacks, moved_by_reassignment=s.part.moved, kmeans_iterations=s.part.iterations,
        kept=int(s.kept.sum()) if s.kept is not None else 0)


def _bar(progress: bool, total: int, desc: str):
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="node" if desc == "partition" else "merge", leave=False)
