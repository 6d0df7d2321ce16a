"""One compression, one module per stage of the method: read :mod:`.compression` top to bottom.

    store ─setup_run()─▶ RunSetup: partition_nodes() ─▶ Partition, removal_quotas() ─▶ Quotas,
                                   build_trees() ─▶ BucketLayout
    per round (merge_round()):  plan_round() ─▶ Plan ─▶ merge_texts() ─▶ embedder / pair_means
                                ─▶ apply_round()
    at the end: assemble() ─▶ MemoryStore

The stages, each a module: :mod:`.partition` (k-means, two-level k-means, the keep and group
rules), :mod:`.quotas`, :mod:`.trees` (the buckets of trees, their vectors and candidate
graphs), :mod:`.edges` (the edge weight), :mod:`.plan` (spanning forests, scores, the
round's pairs), :mod:`.merge_call` (one merger call a round), :mod:`.apply` (the round
written into the trees), :mod:`.node_table` (who merged into whom) and :mod:`.output` (the
output store, its merges and event trees, what a run returns). :mod:`.compression` sets a
run up, runs its rounds (:func:`compress`) or plans the first round only (:func:`dry_run`).
:mod:`.memory` is how a run saves memory (:class:`MemoryPlan`, handed in by the caller);
:mod:`.reference` is the plain-Python merge order the engine is tested against.
:mod:`.placement` places new rows into recorded trees, and the subpackage
:mod:`.compaction` keeps tenants within their node limits with the same stages; tests/host_reads.py
counts the device reads of a run.
"""
from .compaction import CompactReport, CompactResult, compact
from .compression import compress, dry_run
from .edges import DATE_TAG_TOKENS
from .memory import MemoryPlan
from .node_table import merged_id
from .output import CompressReport, CompressResult, DryRunResult, MergeRecord
from .partition import Partition, partition_nodes
from .plan import Plan, plan_round
from .quotas import Quotas, removal_quotas
from .trees import BucketLayout, build_trees

__all__ = ["compress", "compact", "CompactResult", "CompactReport", "dry_run", "CompressResult", "CompressReport",
           "DryRunResult", "MergeRecord", "merged_id", "DATE_TAG_TOKENS", "Partition", "partition_nodes", "Quotas",
           "removal_quotas", "BucketLayout", "build_trees", "Plan", "plan_round", "MemoryPlan"]
