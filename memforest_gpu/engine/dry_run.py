"""The dry run: what :func:`~.compress.compress` would merge first, without merging."""
from __future__ import annotations

import time

import numpy as np

from ..config import CompressConfig
from ..store.memory_store import MemoryStore
from .compress import merge_records, older_first, run_report, setup_run
from .partition import Partition
from .plan import plan_round
from .quotas import Quotas
from .result import DryRunResult

__all__ = ["dry_run"]


def dry_run(store: MemoryStore, config: CompressConfig | None = None, *, embedder=None, device=None,
            partition: Partition | None = None, quotas: Quotas | None = None, budget: int = 1 << 24) -> DryRunResult:
    """A dry run: partition, quotas and trees as :func:`~.compress.compress` would build them, and the
    pairs of the first round. Merges nothing."""
    s = setup_run(store, config, embedder, device, False, partition, quotas, budget)
    q = s.quotas
    need = (q.per_tree > 0) & (q.tree_size >= 2)
    p = plan_round(s.batch, need, q.per_tree, s.cfg, s.plan_cap, np.random.default_rng(s.cfg.merge.seed))
    older, newer = older_first(s.table, p)
    records = merge_records(s.table, 1, older, newer, p.similarity)
    pairs = s.table.merge_pairs(older, newer)
    s.times["total"] = time.perf_counter() - s.times.pop("_t0")
    report = run_report(s, store, None, embedder, store, q.shortfall, 0, 0, 0)
    return DryRunResult(records, pairs, report)
