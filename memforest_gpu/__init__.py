"""memforest-gpu: GPU-accelerated MemForest compression of LLM-agent memory stores.

>>> from memforest_gpu import MemoryStore, compress, CompressConfig, MergeConfig
>>> result = compress(store, CompressConfig(merge=MergeConfig(ratio=0.5)))
>>> result.store, result.report
"""
from .config import CompactConfig, CompressConfig, MergeConfig, PartitionConfig, RetrievalConfig, TreeConfig
from .engine import CompactResult, CompressReport, CompressResult, compact, compress
from .mergers import ExtractiveMerger, MemoryItem, MergePair, Merger
from .mergers.embedders import SentenceTransformerEmbedder
from .retrieval.retriever import Retriever, SearchResult, search
from .store.io import read_store, write_store
from .store.memory_store import MemoryStore

__version__ = "0.1.0"

__all__ = [
    "MemoryStore", "read_store", "write_store", "compress", "CompressResult", "CompressReport",
    "compact", "CompactResult", "CompactConfig", "CompressConfig", "PartitionConfig", "TreeConfig", "MergeConfig",
    "RetrievalConfig",
    "SentenceTransformerEmbedder", "Merger", "MergePair", "MemoryItem", "ExtractiveMerger",
    "Retriever", "SearchResult", "search",
]
