"""One compression, one module per stage (read top to bottom in :mod:`.compress`).

    store ─partition_nodes()─▶ Partition ─removal_quotas()─▶ Quotas ─build_trees()─▶ TreeBatch
    per round:  plan_round() ─▶ Plan ─▶ merge_round() ─▶ embedder / pair_means ─▶ apply_round()
    at the end: assemble() ─▶ MemoryStore

:mod:`.partition` (with :mod:`.two_level`), :mod:`.quotas`, :mod:`.trees`, :mod:`.plan`,
:mod:`.merge_call`, :mod:`.apply`, :mod:`.node_table` and :mod:`.assemble` are the stages;
:mod:`.compress` wires them; :mod:`.host_reads` counts the device reads a run makes.
"""
from .compress import CompressReport, CompressResult, compress
from .node_table import merged_id
from .plan import DATE_TAG_TOKENS
from .records import MergeRecord

__all__ = ["compress", "CompressResult", "CompressReport", "MergeRecord", "merged_id", "DATE_TAG_TOKENS"]
