"""Mem0 stores compressed and compacted in place (docs/adapters.md).

:mod:`.inplace` compresses a scope (Qdrant, Chroma, pgvector or FAISS vector store) with a
backup first (:mod:`.backup`) and a restore that puts the scope back exactly (:mod:`.restore`);
:mod:`.compaction` keeps each user within a budget as memories arrive, its trees in a state file.
:mod:`.client` opens Mem0 after :mod:`.service_checks`' checks of its config (:mod:`.config_file`);
:mod:`.vectors` (and :mod:`.vectors_pg`) read and write its vector store natively, one
:class:`~.points.Point` per memory; :mod:`.write` writes what Mem0's add and delete write, in
batches; :mod:`.plan_text` prints a dry run's plan. Mem0 itself (and its vector stores' clients) is
imported only when a store is opened.
"""
from .compaction import compact_mem0
from .inplace import Mem0CompressResult, Scope, close_memory, compress_mem0, format_plan, load_memory, restore_mem0

__all__ = ["Scope", "load_memory", "close_memory", "compress_mem0", "restore_mem0", "compact_mem0", "format_plan",
           "Mem0CompressResult"]
