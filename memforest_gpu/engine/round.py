"""One merge round of every tree of every tenant: plan, merger texts, vectors, apply.

:func:`merge_round` reads like the card of one round: :func:`~.plan.plan_round` chooses the
pairs, ONE merger call writes their texts (:func:`~.merge_call.merge_texts`), the embedder
(or the pair means) gives their vectors, :func:`~.apply.apply_round` writes them into the
trees and :class:`~.node_table.NodeTable` records who merged into whom. :class:`Owed` is
what the trees still have to lose, updated in place.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..heap import release_free_heap, release_mappings
from .apply import apply_round, pair_means
from .merge_call import merge_texts
from .merge_log import MergeLog
from .node_table import NodeTable
from .plan import Plan, plan_round
from .quotas import Quotas, redistribute
from .result import MergeRecord
from .setup import RunSetup

__all__ = ["Owed", "Round", "merge_round", "older_first", "round_merges"]

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
        p = plan_round(s.batch, need, owed.remaining, s.cfg, s.plan_cap, rng)
        got = np.bincount(p.tree_np, minlength=len(owed.size))  # (T,) pairs each tree merges
        owed.stuck |= need & (got == 0)
        redistribute(owed.stuck, owed.remaining, owed.size, s.quotas.tree_tenant, owed.shortfall)
    if not len(p):
        return None
    release_free_heap(_PLAN_FREED)  # the planner's freed blocks, before the merger's inputs and texts
    with s.timer.stage("merge"):
        older, newer = older_first(s.table, p)
        pairs = s.table.merge_pairs(older, newer)
        release_mappings()  # the input's mapped texts, paged in for the pairs (store.mapped_texts)
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
    """The round's merges: a :class:`~.merge_log.MergeLog` over the table (each record's merged
    text is the table's own string, not a copy), or a dry run's list of :class:`MergeRecord`
    (``new`` None: no ``into`` / ``text``)."""
    if new is not None:
        return MergeLog.of_round(table, number, older, newer, new, sims)
    ten, ia, ib = table.tenant_of(older), table.ids_of(older), table.ids_of(newer)
    w = np.asarray(sims, dtype=np.float64).tolist()
    return [MergeRecord(number, ten[k], ia[k], ib[k], w[k]) for k in range(len(ia))]
