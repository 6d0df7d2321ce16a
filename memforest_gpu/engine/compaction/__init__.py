"""Compaction: keep every tenant within its node limit as memories arrive (docs/compaction.md).

:mod:`.replan` runs it (:func:`compact`): the tenant's recorded event trees read back and new
rows placed into them (:mod:`.compacted_trees`, :mod:`memforest_gpu.engine.placement`), removal
quotas over the trees with the most excess, which say the trees to re-plan
(:mod:`.replan_quotas`), then the same compression as a full run over those trees only.
"""
from .replan import CompactReport, CompactResult, check_keys_rule, compact, keys_bound, rule_differs

__all__ = ["compact", "CompactReport", "CompactResult", "check_keys_rule", "keys_bound", "rule_differs"]
