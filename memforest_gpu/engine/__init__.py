"""One compression, one module per stage: read :mod:`.compress` top to bottom.

    store ─partition_nodes()─▶ Partition ─removal_quotas()─▶ Quotas ─build_trees()─▶ TreeBatch
    per round:  plan_round() ─▶ Plan ─▶ merge_round() ─▶ embedder / pair_means ─▶ apply_round()
    at the end: assemble() ─▶ MemoryStore

The stages are :mod:`.partition` (with :mod:`.two_level`), :mod:`.quotas`, :mod:`.trees`,
:mod:`.plan` (with :mod:`.lengths`), :mod:`.merge_call`, :mod:`.apply`, :mod:`.node_table` and
:mod:`.assemble`; :mod:`.compress` wires them, :mod:`.compact` (with :mod:`.placement`,
:mod:`.compact_quotas` and :mod:`.forest`) keeps tenants within a budget with the same stages, :mod:`.dry_run` plans the first round only,
:mod:`.result` holds what both return and :mod:`.host_reads` counts the device reads of a run.
"""
from .compact import CompactReport, CompactResult, compact
from .compress import compress
from .dry_run import dry_run
from .lengths import DATE_TAG_TOKENS
from .node_table import merged_id
from .partition import Partition, partition_nodes
from .plan import Plan, plan_round
from .quotas import Quotas, removal_quotas
from .records import MergeRecord
from .result import CompressReport, CompressResult, DryRunResult
from .trees import TreeBatch, build_trees

__all__ = ["compress", "compact", "CompactResult", "CompactReport", "dry_run", "CompressResult", "CompressReport", "DryRunResult", "MergeRecord", "merged_id",
           "DATE_TAG_TOKENS", "Partition", "partition_nodes", "Quotas", "removal_quotas", "TreeBatch", "build_trees",
           "Plan", "plan_round"]
