"""The memory store and its files.

:class:`MemoryStore` holds a store's columns (ids, texts, float32 embeddings, timestamps,
tenant codes, sources, metadata; :mod:`.columns` views them, :mod:`.column_checks` validates
them); :mod:`.io` reads and writes Parquet / JSON Lines files and :mod:`.atomic` makes
every write crash-safe; :mod:`.timeutil` parses and formats timestamps; :mod:`.synthetic`
makes stores for tests and benchmarks.
"""
from .atomic import atomic_open, atomic_write_text
from .io import FORMATS, detect_format, read_store, write_store
from .memory_store import DEFAULT_TENANT, MemoryStore

__all__ = ["MemoryStore", "DEFAULT_TENANT", "read_store", "write_store", "detect_format", "FORMATS",
           "atomic_open", "atomic_write_text"]
