"""The dry run: what :func:`~.compress.compress` would merge first, without merging."""
from __future__ import annotations

import numpy as np

from ..config import CompressConfig
from ..store.memory_store import MemoryStore
from .compress import run_report
from .partition import Partition
from .plan import plan_round
from .quotas import Quotas
from .result import DryRunResult
from .round import Owed, older_first, round_merges
from .setup import setup_run

__all__ = ["dry_run"]


def dry_run(store: MemoryStore, config: CompressConfig | None = None, *, embedder=None, device=None,
            partition: Partition | None = None, quotas: Quotas | None = None, budget: int = 1 << 24) -> DryRunResult:
    """A dry run: partition, quotas and trees as :func:`~.compress.compress` would build them,
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
