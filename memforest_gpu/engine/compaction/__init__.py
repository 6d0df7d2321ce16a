"""Compaction: keep every tenant within a budget as memories arrive (docs/compaction.md).

:mod:`.replan` runs it (:func:`compact`): new rows placed into the tenant's recorded event trees
(:mod:`memforest_gpu.engine.placement`), removal quotas over the trees with the most excess
(:mod:`.quotas`), the trees to re-plan (:mod:`.trees`), then the same compression as a full run
over those trees only.
"""
from .replan import CompactReport, CompactResult, check_keys_rule, compact, keys_bound, rule_differs

__all__ = ["compact", "CompactReport", "CompactResult", "check_keys_rule", "keys_bound", "rule_differs"]
