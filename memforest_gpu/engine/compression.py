"""MemForest compression (docs/method.md sections 1-3): the stages wired together.

    store ─setup_run()─▶ RunSetup (partition_nodes ─▶ Partition, removal_quotas ─▶ Quotas,
                                   build_trees ─▶ BucketLayout)
    per round:  merge_round(): plan_round ─▶ Plan ─▶ merge_texts (one merger call)
                ─▶ embedder / pair_means ─▶ apply_round (device)  +  NodeTable (host)
    at the end: assemble() ─▶ MemoryStore, run_report() ─▶ CompressReport

Read top to bottom: the setup (:func:`setup_run` -> :class:`RunSetup`: the inputs checked,
then partition, quotas and trees, or the ones a caller hands in); one round
(:func:`merge_round`; :class:`Owed`: what the trees still have to lose); :func:`compress`,
which only runs the rounds and puts the result together; the report; :func:`dry_run`, the
same setup and the first round's plan only. How the run saves memory (vectors written into
the input's dead rows, heap pages handed back, texts mapped) is one object,
:class:`~.memory.MemoryPlan`, that the caller hands in. The host reads a constant number of
device values per round (the plan), whatever the number of trees, pairs and tenants
(tests/host_reads.py counts them).
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from ..config import CompressConfig
from ..device import resolve_device
from ..mergers.embedders import MEAN_EMBEDDER
from ..report import TenantRow
from ..store.memory_store import MemoryStore
from ..store.size import store_size
from ..timer import StageTimer
from .apply import apply_round, pair_means
from .memory import MemoryPlan
from .merge_call import cap_and_counter, count_column, merge_texts, with_fallback
from .node_table import NodeTable
from .output import (
    CompressReport,
    CompressResult,
    DryRunResult,
    MergeLog,
    MergeRecord,
    assemble,
    output_keys,
    record_event_trees,
    with_centres,
)
from .partition import Partition, check_rules, constrain, partition_nodes
from .plan import Plan, plan_round
from .quotas import Quotas, redistribute, removal_quotas
from .trees import BucketLayout, build_trees

__all__ = ["RunSetup", "setup_run", "STAGES", "progress_bar", "Owed", "Round", "merge_round", "older_first",
           "round_merges", "compress", "dry_run", "run_report", "Tally"]


#: the stages a run's timer books, in order (``report.seconds`` adds ``total``)
STAGES = ("partition", "setup", "plan", "merge", "embed", "apply", "output")


@dataclass
class RunSetup:
    """A run ready for its rounds.

    ``names``: tenant names (codes index them); ``emb`` (N, D): the store's vectors on the
    run's device; ``cap``: the node-token cap (``None``: none) and ``counter`` the function
    that counts a text's tokens against it (or for the size term); ``kept`` (n_tenants,):
    nodes the keep rule holds out of merging (``None``: no rule); ``batch`` is dropped once
    the rounds are over; ``memory``: how the run saves memory (:class:`~.memory.MemoryPlan`).
    """

    cfg: CompressConfig
    names: list[str]
    part: Partition
    quotas: Quotas
    batch: BucketLayout | None
    table: NodeTable
    emb: torch.Tensor
    cap: int | None
    counter: Callable | None
    timer: StageTimer
    memory: MemoryPlan
    kept: np.ndarray | None = None

    @property
    def plan_cap(self) -> int | None:
        """The cap the planner excludes pairs by: ``strict`` only (``condense`` merges any pair
        and cuts the text to the cap)."""
        return self.cap if self.cfg.merge.cap_policy == "strict" else None


def setup_run(store: MemoryStore, config: CompressConfig | None = None, *, embedder=None, device=None,
              progress: bool = False, partition: Partition | None = None, quotas: Quotas | None = None,
              memory: MemoryPlan | None = None) -> RunSetup:
    """Check the inputs, then partition (unless ``partition`` is given), quotas (unless
    ``quotas`` is given) and trees, the run's memory saved as ``memory`` says (default: the
    plan :meth:`~.memory.MemoryPlan.from_environment`)."""
    timer = StageTimer(STAGES)
    cfg = config or CompressConfig()
    memory = memory if memory is not None else MemoryPlan.from_environment()
    _check_inputs(store, cfg, embedder)
    if partition is None:  # a whole compress (a compaction checks its store in compact())
        check_rules(store, cfg.merge.keep_pattern, cfg.merge.merge_within)
    dev = resolve_device(device)
    emb, ts = store.embeddings.to(dev), store.timestamps.to(dev)
    names, codes = store.tenant_index()
    codes = codes.to(dev)
    with timer.stage("partition"):
        if partition is None:
            with progress_bar(progress, len(store), "partition", unit="node") as bar:
                partition = partition_nodes(emb, ts, codes, names, cfg.partition, tile_elements=memory.tile_elements,
                                            progress=bar.update if bar else None, memory_budget=cfg.memory_budget)
        else:
            _check_partition(partition, len(store), len(names))
        partition, kept = constrain(partition, store, cfg.merge.keep_pattern, cfg.merge.merge_within)  # who may merge
    with timer.stage("setup"):
        n_trees = int(partition.tree_tenant.shape[0])
        tree_size = torch.bincount(partition.tree, minlength=n_trees).cpu().numpy().astype(np.int64)
        if quotas is None:
            tenant_size = np.bincount(codes.cpu().numpy(), minlength=len(names))
            quotas = removal_quotas(tree_size, partition.tree_tenant.cpu().numpy(), tenant_size - kept, cfg.merge.ratio)
        elif len(quotas.per_tree) != n_trees or not np.array_equal(quotas.tree_size, tree_size):
            raise ValueError(f"quotas must be for the partition's {n_trees} trees of sizes "
                             f"{tree_size.tolist()[:8]}..., got {len(quotas.per_tree)} trees")
        # the size term and the bounds of engine/edges.py need lengths too
        t = cfg.spanning
        counted = t.size_weight > 0 or t.length_last is not None or t.drift_min_cos is not None
        cap, counter = cap_and_counter(cfg.merge.max_node_tokens, embedder, count=counted)
        tokens = torch.as_tensor(count_column(counter, store.texts)).to(dev) if counter is not None else None
        batch = build_trees(partition.tree, tree_size, emb, ts, codes, tokens, dtype=getattr(torch, cfg.storage_dtype),
                            config=cfg.spanning, cap=cap if cfg.merge.cap_policy == "strict" else None,
                            merges=int(quotas.per_tree.sum()), reuse=memory.reuses_rows(cfg, emb, store),
                            save_codes=cfg.merge.keys != 0)
    table = NodeTable(store, map_texts=memory.maps_texts(store.texts.arrow.nbytes))
    return RunSetup(cfg, names, partition, quotas, batch, table, emb, cap, counter, timer, memory, kept)


def _check_inputs(store: MemoryStore, cfg: CompressConfig, embedder) -> None:
    if not isinstance(cfg, CompressConfig):
        raise ValueError(f"config must be a CompressConfig, got {type(cfg).__name__}")
    if not isinstance(store, MemoryStore):
        raise ValueError(f"store must be a MemoryStore, got {type(store).__name__}")
    if embedder is not None and embedder.dim != store.dim:
        raise ValueError(
            f"embedder dimension must match the store's ({store.dim}), got {embedder.dim} from {embedder.name!r}; "
            "use the model that made the store's vectors, or no embedder (mean of the two vectors)")


def _check_partition(part: Partition, n: int, n_tenants: int) -> None:
    if not isinstance(part, Partition):
        raise ValueError(f"partition must be a Partition, got {type(part).__name__}")
    if tuple(part.tree.shape) != (n,):
        raise ValueError(f"partition.tree must have one tree id per node ({n},), got shape {tuple(part.tree.shape)}")
    T = int(part.tree_tenant.shape[0])
    tt = part.tree_tenant.cpu()
    if n and (int(part.tree.min()) < 0 or int(part.tree.max()) >= T):
        raise ValueError(f"partition.tree must hold tree ids in [0, {T}), "
                         f"got {int(part.tree.min())}..{int(part.tree.max())}")
    if T and (bool((tt[1:] < tt[:-1]).any()) or int(tt.min()) < 0 or int(tt.max()) >= n_tenants):
        raise ValueError(f"partition.tree_tenant must be sorted tenant codes in [0, {n_tenants})")


# The progress bars of a run.
@contextmanager
def progress_bar(show: bool, total: int, desc: str, *, unit: str):
    """A tqdm bar of ``total`` ``unit`` while the block runs, or ``None`` when not ``show``."""
    if not show:
        yield None
        return
    bar = tqdm(total=total, desc=desc, unit=unit, leave=False)
    try:
        yield bar
    finally:
        bar.close()


# ------------------------------------------------------------------------------
# One merge round of every tree of every tenant: plan, merger texts, vectors, apply.
#
# :func:`merge_round` reads like the card of one round: :func:`~.plan.plan_round` chooses the
# pairs, ONE merger call writes their texts (:func:`~.merge_call.merge_texts`), the embedder
# (or the pair means) gives their vectors, :func:`~.apply.apply_round` writes them into the
# trees and :class:`~.node_table.NodeTable` records who merged into whom. :class:`Owed` is
# what the trees still have to lose, updated in place.
# ------------------------------------------------------------------------------

_PLAN_FREED = 64 << 20  # the heap is trimmed after planning when at least this much of it is free


@dataclass
class Owed:
    """What the trees still have to lose. Shape: remaining, size, stuck (T,); shortfall
    (n_tenants,)."""

    remaining: np.ndarray  # merges each tree still owes
    size: np.ndarray  # its live nodes
    stuck: np.ndarray  # bool: no eligible pair left (node cap); its rest went to its tenant's other trees
    shortfall: np.ndarray  # per tenant: removals no tree could take

    @staticmethod
    def start(q: Quotas) -> Owed:
        return Owed(q.per_tree.copy(), q.tree_size.copy(), np.zeros(len(q.tree_size), dtype=bool), q.shortfall.copy())

    def need(self) -> np.ndarray:
        """(T,) bool: the trees that still merge."""
        return (self.remaining > 0) & ~self.stuck & (self.size >= 2)


@dataclass(frozen=True)
class Round:
    """One round's outcome. Shape: vectors (P, D) the merged nodes' vectors; consumed (2P,)
    the node rows merged away."""

    merges: MergeLog
    vectors: torch.Tensor
    consumed: np.ndarray
    fallbacks: int  # texts the fallback merger made
    condensed: int  # merges cut to the node cap
    condensed_tokens: int  # tokens those cuts dropped


def merge_round(s: RunSetup, owed: Owed, number: int, merger, fallback, embedder, rng) -> Round | None:
    """Round ``number`` (1-based) of the run ``s``: ``None`` when no tree had a pair to merge
    (``owed`` is still updated: trees left without an eligible pair hand their rest over)."""
    need = owed.need()
    with s.timer.stage("plan"):
        p = plan_round(s.batch, need, owed.remaining, s.cfg, s.plan_cap, rng, memory=s.memory)
        got = np.bincount(p.tree_np, minlength=len(owed.size))  # (T,) pairs each tree merges
        owed.stuck |= need & (got == 0)
        redistribute(owed.stuck, owed.remaining, owed.size, s.quotas.tree_tenant, owed.shortfall)
    if not len(p):
        return None
    s.memory.release(_PLAN_FREED)  # the planner's freed blocks, before the merger's inputs and texts
    with s.timer.stage("merge"):
        older, newer = older_first(s.table, p)
        pairs = s.table.merge_pairs(older, newer)
        s.memory.release_mappings()  # the input's mapped texts, paged in for the pairs (store.mapped_texts)
        texts = merge_texts(merger, fallback, pairs, counter=s.counter, cap=s.cap, cap_policy=s.cfg.merge.cap_policy)
        pairs = None
    # a table that reuses its rows (NodeVectors.put) keeps a merged vector at its earliest original's row
    reuse = s.batch.vectors.reuse
    at = np.minimum(s.table.first[older], s.table.first[newer]) if reuse else None
    rows = len(s.table) + np.arange(len(older), dtype=np.int64)  # the merged nodes' rows (table.add's)
    with s.timer.stage("embed"):
        if embedder is not None:
            vectors = embedder.embed(texts.texts).to(s.emb.device, torch.float32)
        else:
            vectors = pair_means(s.batch, p, put=(rows, at) if reuse else None)
    with s.timer.stage("apply"):
        new = s.table.add_many(older, newer, texts.texts)
        assert np.array_equal(new, rows)
        tokens = None if texts.tokens is None else torch.tensor(texts.tokens, dtype=torch.int64)
        apply_round(s.batch, p, vectors, new, tokens, at=at)
        owed.remaining -= got
        owed.size -= got
        merges = round_merges(s.table, number, older, newer, p.similarity, new)
    return Round(merges, vectors, np.concatenate([older, newer]), texts.fallbacks,
                 sum(d > 0 for d in texts.dropped), sum(texts.dropped))


def older_first(table: NodeTable, p: Plan) -> tuple[np.ndarray, np.ndarray]:
    """Each planned pair as (older, newer) rows: the merger's order."""
    return table.order_many(p.node_a, p.node_b)


def round_merges(table: NodeTable, number: int, older: np.ndarray, newer: np.ndarray, sims,
                 new: np.ndarray | None = None) -> MergeLog | list[MergeRecord]:
    """The round's merges: a :class:`~.output.MergeLog` over the table (each record's merged
    text is the table's own string, not a copy), or a dry run's list of :class:`MergeRecord`
    (``new`` None: no ``into`` / ``text``)."""
    if new is not None:
        return MergeLog.of_round(table, number, older, newer, new, sims)
    ten, ia, ib = table.tenant_of(older), table.ids_of(older), table.ids_of(newer)
    w = np.asarray(sims, dtype=np.float64).tolist()
    return [MergeRecord(number, ten[k], ia[k], ib[k], w[k]) for k in range(len(ia))]


# ------------------------------------------------------------------------------
# The run: every round until every quota is met, then the output and the report.
# ------------------------------------------------------------------------------


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
             partition: Partition | None = None, quotas: Quotas | None = None,
             memory: MemoryPlan | None = None) -> CompressResult:
    """Compress ``store`` with MemForest.

    Args:
        config: stage configs (defaults: docs/method.md).
        merger: any :class:`~memforest_gpu.mergers.Merger`; default the extractive merger.
        embedder: re-embeds merged text (``None``: normalised mean of the two inputs).
        device: where the tensor work runs (``None``: CUDA when present).
        progress: show progress bars.
        on_round: called after each round with (round, the round's merges: a
            :class:`~.output.MergeLog`, a sequence of :class:`~.output.MergeRecord`).
        partition, quotas: a ready partition of ``store`` (and its quotas) instead of
            computing them (the distributed runner hands each rank its trees this way).
        memory: how the run saves memory (:class:`~.memory.MemoryPlan`; default
            :meth:`~.memory.MemoryPlan.from_environment`: the input's vectors are not
            overwritten). ``MemoryPlan(overwrite_input=True)`` lets the run write merged
            vectors into ``store.embeddings`` and the output's vectors over them (then a view
            of its first rows): no second vector table, for callers that drop ``store`` after,
            as ``compress_file`` does. A run on another device writes into its own copy anyway.

    Every tenant loses exactly ``round(ratio * N_t)`` nodes unless it cannot (report's
    ``shortfall``); every original id ends in exactly one output node's ``sources``.
    """
    s = setup_run(store, config, embedder=embedder, device=device, progress=progress, partition=partition,
                  quotas=quotas, memory=memory)
    s.memory.release()  # the partition's and the trees' freed blocks (memforest_gpu.heap)
    reuse = s.batch.vectors.reuse  # merged vectors in the input's dead rows: centres first (they read it)
    centre = _centres(s, store) if reuse and partition is None else None
    merger, fallback = with_fallback(merger)
    owed = Owed.start(s.quotas)
    rng = np.random.default_rng(s.cfg.merge.seed)  # only the "random" spanning kind draws from it
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
            s.memory.release()  # the round's planning and apply transients
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
        out = _output(s, store, consumed, vectors, record=partition is None, centre=centre, saved=saved)
    s.memory.release()
    report = run_report(s, store, out=out, merger=merger, embedder=embedder, shortfall=owed.shortfall, tally=tally)
    return CompressResult(out, report, merges)


def _centres(s: RunSetup, store: MemoryStore) -> np.ndarray:
    """Each tree's centre for the output's event trees (:func:`with_centres`: it reads the input's
    vectors, so before anything overwrites them)."""
    return with_centres(store, s.part.tree.cpu().numpy(), s.part.centre.cpu().numpy())


def _output(s: RunSetup, store: MemoryStore, consumed: list[np.ndarray], vectors: list[torch.Tensor] | None,
            record: bool, centre: np.ndarray | None = None, saved=None) -> MemoryStore:
    """The live rows as the output store. The merged vectors' blocks are released as they are
    read (``None``: every live row's vector is in ``s.emb`` at its earliest original's row, the
    rows a run reusing them wrote, :meth:`~.node_vectors.NodeVectors.put`); the output's vectors
    overwrite the run's own (``s.emb``) unless they are the caller's store's and the memory
    plan does not let the run overwrite them.
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
    s.memory.release()  # the keys' transients (1M nodes: ~200 MB of freed blocks)
    in_place = s.memory.overwrite_input or s.emb is not store.embeddings
    out = keys.attach(assemble(table, live, s.emb, vectors, in_place=in_place))
    s.memory.release()  # the output columns' transients (1M nodes: ~370 MB), before the event trees
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
            partition: Partition | None = None, quotas: Quotas | None = None,
            memory: MemoryPlan | None = None) -> DryRunResult:
    """A dry run: partition, quotas and trees as :func:`compress` would build them,
    and the
    pairs of the first round. Merges nothing."""
    s = setup_run(store, config, embedder=embedder, device=device, partition=partition, quotas=quotas, memory=memory)
    owed = Owed.start(s.quotas)
    with s.timer.stage("plan"):
        p = plan_round(s.batch, owed.need(), owed.remaining, s.cfg, s.plan_cap,
                       np.random.default_rng(s.cfg.merge.seed), memory=s.memory)
    older, newer = older_first(s.table, p)
    merges = round_merges(s.table, 1, older, newer, p.similarity)
    return DryRunResult(merges, s.table.merge_pairs(older, newer), run_report(s, store, embedder=embedder),
                        dict(zip(s.names, s.quotas.target.tolist())))
