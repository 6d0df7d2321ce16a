"""Adapters to real memory systems.

- :mod:`.mem0` (a subpackage): compress or compact a Mem0 store in place (Qdrant, Chroma,
  pgvector or FAISS vector store), with a backup first and a restore that puts the scope back
  exactly.
- :mod:`.graph`: graph memories in our JSONL / Parquet format; :mod:`.m3agent`: M3-Agent's
  own pickled ``VideoGraph``; :mod:`.streammeco` (and :mod:`.m3_streammeco` for M3-Agent's
  graphs): the StreamMeCo pruning baseline.

The commands ``memforest mem0 compress|restore`` and ``memforest graph compress`` are
:mod:`memforest_gpu.cli.adapters`. Mem0 itself (and its vector stores' clients) is imported
only when a store is opened.
"""
from .mem0 import Mem0CompressResult, Scope, close_memory, compress_mem0, format_plan, load_memory, restore_mem0

__all__ = ["Scope", "load_memory", "close_memory", "compress_mem0", "restore_mem0", "format_plan",
           "Mem0CompressResult"]
