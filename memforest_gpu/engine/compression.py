"""MemForest compression (docs/method.md sections 1-3): the stages wired together.

    store ─setup_run()─▶ RunSetup (partition_nodes ─▶ Partition, removal_quotas ─▶ Quotas,
                                   build_trees ─▶ TreeBatch)
    per round:  merge_round(): plan_round ─▶ Plan ─▶ merge_texts (one merger call)
                ─▶ embedder / pair_means ─▶ apply_round (device)  +  NodeTable (host)
    at the end: assemble() ─▶ MemoryStore, run_report() ─▶ CompressReport

Each stage is a function in its own module; :func:`compress` only runs the rounds and puts
the result together. :func:`dry_run` takes the same setup and plans the first round only.
The host reads a constant number of device values per round (the plan), whatever the number
of trees, pairs and tenants (tests/host_reads.py counts them).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..config import CompressConfig
from ..heap import release_free_heap
from ..mergers.embedders import MEAN_EMBEDDER
from ..report import TenantRow
from ..store.memory_store import MemoryStore
from ..store.size import store_size
from .assemble import assemble, output_keys
from .merge_call import with_fallback
from .merge_log import MergeLog
from .partition import Partition
from .plan import plan_round
from .quotas import Quotas
from .result import CompressReport, CompressResult, DryRunResult
from .round import Owed, merge_round, older_first, round_merges
from .setup import RunSetup, progress_bar, setup_run
from .tree_record import record_event_trees, with_centres

__all__ = ["compress", "dry_run", "run_report", "Tally"]


@dataclass
class Tally:
    """What the rounds did, for the report."""

    rounds: int = 0
    merges: int = 0
    fallbacks: int = 0  # texts the fallback merger made
    condensed: int = 0  # merges cut to the node cap
    condensed_tokens: int = 0  # tokens those cuts dropped


def compress(store: MemoryStore, config: CompressConfig | None = None, *, merger=None, embedder=None,
             device=None, progress: bool = False, on_round: Callable[[int, MergeLog], None] | None = None,
             partition: Partition | None = None, quotas: Quotas | None = None, budget: int = 1 << 24,
             copy: bool = True) -> CompressResult:
    """Compress ``store`` with MemForest.

    Args:
        config: stage configs (defaults: docs/method.md).
        merger: any :class:`~memforest_gpu.mergers.Merger`; default the extractive merger.
        embedder: re-embeds merged text (``None``: normalised mean of the two inputs).
        device: where the tensor work runs (``None``: CUDA when present).
        progress: show progress bars.
        on_round: called after each round with (round, the round's merges: a
            :class:`~.merge_log.MergeLog`, a sequence of :class:`~.result.MergeRecord`).
        partition, quotas: a ready partition of ``store`` (and its quotas) instead of
            computing them (the distributed runner hands each rank its trees this way).
        copy: ``False`` lets the run overwrite ``store.embeddings`` as it goes (each merged
            vector in a dead row, :meth:`~.vectors.NodeVectors.put`, where the output's keys
            allow it) and the output's vectors (then a view of its first rows): no second vector
            table, for callers that drop ``store`` after, as ``compress_file`` does. A run on
            another device writes into its own copy anyway.

    Every tenant loses exactly ``round(ratio * N_t)`` nodes unless it cannot (report's
    ``shortfall``); every original id ends in exactly one output node's ``sources``.
    """
    s = setup_run(store, config, embedder=embedder, device=device, progress=progress, partition=partition,
                  quotas=quotas, budget=budget, reuse=not copy)
    release_free_heap()  # the partition's and the trees' freed blocks (memforest_gpu.heap)
    reuse = s.batch.vectors.reuse  # merged vectors in the input's dead rows: centres first (they read it)
    centre = _centres(s, store) if reuse and partition is None else None
    merger, fallback = with_fallback(merger)
    owed = Owed.start(s.quotas)
    rng = np.random.default_rng(s.cfg.merge.seed)  # only the "random" tree kind draws from it
    logs: list[MergeLog] = []  # each round's merges
    # merged nodes' vectors for the output: the trees' own table when it holds them as they
    # are (float32 storage), else one (P, D) block per round
    keep_blocks = s.batch.vectors.dtype != s.emb.dtype
    vectors: list[torch.Tensor] = []
    consumed: list[np.ndarray] = []  # rows merged away, one block per round
    tally = Tally()
    with progress_bar(progress, s.quotas.total, "merging", unit="merge") as bar:
        while owed.need().any():
            r = merge_round(s, owed, tally.rounds + 1, merger, fallback, embedder, rng)
            release_free_heap()  # the round's planning and apply transients
            if r is None:
                continue
            tally.rounds += 1
            tally.fallbacks += r.fallbacks
            tally.condensed += r.condensed
            tally.condensed_tokens += r.condensed_tokens
            logs.append(r.merges)
            if keep_blocks:
                vectors.append(r.vectors)
            consumed.append(r.consumed)
            if on_round is not None:
                on_round(tally.rounds, r.merges)
            if bar:
                bar.update(len(r.merges))
    merges = MergeLog.concat(s.table, logs)
    tally.merges = len(merges)
    fallback.forget()  # the extractive merger's memos: nothing is merged after the last round
    saved = s.batch.vectors.saved if reuse else None  # input rows' int8 codes kept before their rows were reused
    if not keep_blocks:
        vectors = None if reuse else [s.batch.vectors.merged()]
    s.batch = None  # the padded tree tensors are not needed any more
    with s.timer.stage("output"):
        out = _output(s, store, consumed, vectors, copy, record=partition is None, centre=centre, saved=saved)
    release_free_heap()
    report = run_report(s, store, out=out, merger=merger, embedder=embedder, shortfall=owed.shortfall, tally=tally)
    return CompressResult(out, report, merges)


def _centres(s: RunSetup, store: MemoryStore) -> np.ndarray:
    """Each tree's centre for the output's event trees (:func:`with_centres`: it reads the input's
    vectors, so before anything overwrites them)."""
    return with_centres(store, s.part.tree.cpu().numpy(), s.part.centre.cpu().numpy())


def _output(s: RunSetup, store: MemoryStore, consumed: list[np.ndarray], vectors: list[torch.Tensor] | None,
            copy: bool, record: bool, centre: np.ndarray | None = None, saved=None) -> MemoryStore:
    """The live rows as the output store. The merged vectors' blocks are released as they are
    read (``None``: every live row's vector is in ``s.emb`` at its earliest original's row, the
    rows a run reusing them wrote, :meth:`~.vectors.NodeVectors.put`); the output's vectors
    overwrite the run's own (``s.emb``) unless they are the caller's store's and ``copy``.
    ``record``: the run made its own full partition, recorded as the output's event trees so
    that ``compact`` can place new memories into its trees later (``centre``: their centres,
    when already known). ``saved``: the int8 codes of input rows a reusing run overwrote."""
    table = s.table
    live = np.ones(len(table), dtype=bool)
    live[np.concatenate(consumed) if consumed else np.zeros(0, dtype=np.int64)] = False
    if record:  # centres first: the output may overwrite the input's vectors
        tree = s.part.tree.cpu().numpy()
        centre = _centres(s, store) if centre is None else centre
    keys = output_keys(store, table, live, s.cfg.merge, saved=saved)  # keys first: assemble may overwrite
    release_free_heap()  # the keys' transients (1M nodes: ~200 MB of freed blocks)
    out = keys.attach(assemble(table, live, s.emb, vectors, in_place=not copy or s.emb is not store.embeddings))
    release_free_heap()  # the output columns' transients (1M nodes: ~370 MB), before the event trees
    if record:
        record_event_trees(out, store, tree, s.part.tree_tenant.cpu().numpy(), centre, np.sort(table.first[live]),
                           s.names, s.cfg.partition)
    return out


def run_report(s: RunSetup, store: MemoryStore, *, out: MemoryStore | None = None, merger=None, embedder=None,
               shortfall: np.ndarray | None = None, tally: Tally | None = None) -> CompressReport:
    """The run's report; a dry run (no ``out``, no merger) has no per-tenant rows."""
    q = s.quotas
    out = store if out is None else out
    shortfall = q.shortfall if shortfall is None else shortfall
    tally = tally or Tally()
    rows = _tenant_rows(s, out, shortfall) if merger is not None else []
    enc = out.vector_codes if merger is not None else s.cfg.merge.vectors
    sizes = {"size_in": store_size(store, enc).to_dict(), "size_out": store_size(out, enc).to_dict()} \
        if merger is not None else {}  # against the input in the output's encoding (store/size.py)
    return CompressReport(
        tenants=rows, nodes_in=len(store), nodes_out=len(out), trees=len(q.per_tree), rounds=tally.rounds,
        merges=tally.merges, schedule=s.cfg.merge.schedule,
        merger=getattr(merger, "name", type(merger).__name__) if merger else "none",
        embedder=embedder.name if embedder is not None else MEAN_EMBEDDER, max_node_tokens=s.cap,
        seconds=s.timer.finish(), fallbacks=tally.fallbacks, moved_by_reassignment=s.part.moved,
        kmeans_iterations=s.part.iterations, kept=int(s.kept.sum()) if s.kept is not None else 0,
        condensed=tally.condensed, condensed_tokens=tally.condensed_tokens, **sizes)


def _tenant_rows(s: RunSetup, out: MemoryStore, shortfall: np.ndarray) -> list[TenantRow]:
    """One row per tenant: nodes in and out, the removal asked and made, trees, kept nodes."""
    q = s.quotas
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
    return [TenantRow(name, n, o, r, d, f, sf, tr, k)
            for name, n, o, r, d, f, sf, tr, k in zip(s.names, n_in.tolist(), n_out.tolist(), q.target.tolist(),
                                                      removed.tolist(), ratio.tolist(), shortfall.tolist(),
                                                      n_trees.tolist(), kept.tolist())]


def dry_run(store: MemoryStore, config: CompressConfig | None = None, *, embedder=None, device=None,
            partition: Partition | None = None, quotas: Quotas | None = None, budget: int = 1 << 24) -> DryRunResult:
    """A dry run: partition, quotas and trees as :func:`compress` would build them,
    and the
    pairs of the first round. Merges nothing."""
    s = setup_run(store, config, embedder=embedder, device=device, partition=partition, quotas=quotas, budget=budget)
    owed = Owed.start(s.quotas)
    with s.timer.stage("plan"):
        p = plan_round(s.batch, owed.need(), owed.remaining, s.cfg, s.plan_cap,
                       np.random.default_rng(s.cfg.merge.seed))
    older, newer = older_first(s.table, p)
    merges = round_merges(s.table, 1, older, newer, p.similarity)
    return DryRunResult(merges, s.table.merge_pairs(older, newer), run_report(s, store, embedder=embedder),
                        dict(zip(s.names, s.quotas.target.tolist())))
