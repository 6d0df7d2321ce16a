"""One compression, one module per stage: read :mod:`.compression` top to bottom.

    store ─setup_run()─▶ RunSetup: partition_nodes() ─▶ Partition, removal_quotas() ─▶ Quotas,
                                   build_trees() ─▶ TreeBatch
    per round (merge_round()):  plan_round() ─▶ Plan ─▶ merge_texts() ─▶ embedder / pair_means
                                ─▶ apply_round()
    at the end: assemble() ─▶ MemoryStore

The stages are :mod:`.partition` (with :mod:`.two_level` and :mod:`.constraints`),
:mod:`.quotas`, :mod:`.trees` (with :mod:`.knn_graph` and :mod:`.trees`), :mod:`.plan`
(with :mod:`.candidates`, :mod:`.plan_knn`, :mod:`.plan_dense`, :mod:`.edges` and
:mod:`.edges`), :mod:`.merge_call`, :mod:`.apply`, :mod:`.node_table` and :mod:`.assemble`;
:mod:`.setup` and :mod:`.round` hold a run's setup and one round, :mod:`.compression` runs the
rounds (:func:`compress`) or plans the first round only (:func:`dry_run`), and :mod:`.result`
holds what both return. :mod:`.tree_record` and :mod:`.placement` record a run's event trees
and place new rows into them; the subpackage :mod:`.compaction` keeps tenants within a budget
with the same stages; tests/host_reads.py counts the device reads of a run.
"""
from .compaction import CompactReport, CompactResult, compact
from .compression import compress, dry_run
from .edges import DATE_TAG_TOKENS
from .node_table import merged_id
from .partition import Partition, partition_nodes
from .plan import Plan, plan_round
from .quotas import Quotas, removal_quotas
from .result import CompressReport, CompressResult, DryRunResult, MergeRecord
from .trees import TreeBatch, build_trees

__all__ = ["compress", "compact", "CompactResult", "CompactReport", "dry_run", "CompressResult", "CompressReport",
           "DryRunResult", "MergeRecord", "merged_id", "DATE_TAG_TOKENS", "Partition", "partition_nodes", "Quotas",
           "removal_quotas", "TreeBatch", "build_trees", "Plan", "plan_round"]
