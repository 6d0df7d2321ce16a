"""Adapters to real memory systems.

- :mod:`.mem0`: compress a Mem0 store in place (Qdrant, Chroma or FAISS vector store), with a
  backup first (:mod:`.backup`) and a restore that puts the scope back exactly
  (:mod:`.restore`); :mod:`.mem0_client` opens Mem0, :mod:`.vectors` reads and writes
  its vector store natively.
- :mod:`.graph`: graph memories in our JSONL / Parquet format; :mod:`.m3agent`: M3-Agent's
  own pickled ``VideoGraph``; :mod:`.streammeco` (and :mod:`.m3_streammeco` for M3-Agent's
  graphs): the StreamMeCo pruning baseline.

The commands ``memforest mem0 compress|restore`` and ``memforest graph compress`` are
:mod:`memforest_gpu.cli.adapters`.
Nothing heavy is imported with this package (the CLI stays quick); the names below load on
first use.
"""
__all__ = ["Scope", "load_memory", "close_memory", "compress_mem0", "restore_mem0", "format_plan",
           "Mem0CompressResult"]


def __getattr__(name):
    if name in __all__:
        from . import mem0

        return getattr(mem0, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
