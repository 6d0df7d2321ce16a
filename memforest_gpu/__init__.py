"""memforest-gpu: GPU-accelerated MemForest compression of LLM-agent memory stores.

>>> from memforest_gpu import MemoryStore, compress, CompressConfig, MergeConfig
>>> result = compress(store, CompressConfig(merge=MergeConfig(ratio=0.5)))
>>> result.store, result.report

The public names are imported at their first use (:func:`__getattr__`), so importing the
package, or a light module of it such as :mod:`.config` or the command line's parser, does
not load torch.
"""
from __future__ import annotations

from .lazy import public_names

__version__ = "0.1.0"

#: public name -> the module that defines it
_PUBLIC = {
    **dict.fromkeys(["CompactConfig", "CompressConfig", "MergeConfig", "PartitionConfig", "RetrievalConfig",
                     "SpanningConfig"], "memforest_gpu.config"),
    "TreeConfig": "memforest_gpu.config",  # the old name of SpanningConfig (deprecated, not in __all__)
    **dict.fromkeys(["CompactResult", "CompressReport", "CompressResult", "compact", "compress"],
                    "memforest_gpu.engine"),
    **dict.fromkeys(["ExtractiveMerger", "MemoryItem", "MergePair", "Merger"], "memforest_gpu.mergers"),
    "SentenceTransformerEmbedder": "memforest_gpu.mergers.embedders",
    **dict.fromkeys(["Retriever", "SearchResult", "search"], "memforest_gpu.retrieval.retriever"),
    **dict.fromkeys(["read_store", "write_store"], "memforest_gpu.store.io"),
    "MemoryStore": "memforest_gpu.store.memory_store",
}

__all__ = [
    "MemoryStore", "read_store", "write_store", "compress", "CompressResult", "CompressReport",
    "compact", "CompactResult", "CompactConfig", "CompressConfig", "PartitionConfig", "SpanningConfig", "MergeConfig",
    "RetrievalConfig",
    "SentenceTransformerEmbedder", "Merger", "MergePair", "MemoryItem", "ExtractiveMerger",
    "Retriever", "SearchResult", "search",
]


__getattr__, __dir__ = public_names(__name__, _PUBLIC)
