"""The Python API of store files: load, compress, compact, search. The command line calls
these for its store commands; each is a thin door to the package that does the work.

>>> from memforest_gpu.api import compress_file, search_file
>>> result = compress_file("memories.parquet", "compressed.parquet",
...     CompressConfig.preset("memforest"))
>>> hits = search_file("compressed.parquet", ["where did Alice travel?"], k=5)[0]
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from .config import CompressConfig, RetrievalConfig
from .engine import CompressResult
from .retrieval.retriever import Retriever
from .runs.budgeted import compress_file_budgeted
from .runs.compact import compact_file
from .runs.errors import OptionError
from .runs.loading import RunInterrupted, load_store, load_store_and_embedder, resolve_embedder
from .runs.single import compress_in_memory, dry_run_file
from .store.io import detect_format, read_store, write_store

__all__ = ["load_store", "load_store_and_embedder", "resolve_embedder", "read_store", "write_store",
           "compress_file", "dry_run_file", "compact_file", "search_file", "RunInterrupted"]


def compress_file(src: str | Path, dst: str | Path, config: CompressConfig, *, memory_budget: int | None = None,
                  echo: Callable[[str], None] | None = None, **options) -> CompressResult:
    """Read ``src``, compress it, write ``dst`` atomically
    (:func:`~.runs.single.compress_in_memory`:
    its ``options``, the journal and ``resume``). With ``memory_budget`` (bytes) the store is
    compressed one group of whole tenants at a time, to the same output
    (:func:`~.runs.budgeted.compress_file_budgeted`; ``echo`` receives its progress lines)."""
    if memory_budget is None:
        if echo is not None:
            raise ValueError("echo applies to a run with a memory_budget, got echo without one")
        return compress_in_memory(src, dst, config, **options)
    options.pop("journal", None)  # a budgeted run always journals
    return compress_file_budgeted(src, dst, config, memory_budget=memory_budget, echo=echo, **options)


def search_file(path: str | Path, queries: Sequence[str], *, k: int = 10, agpr: bool = False,
                tenant: str | None = None, embedder: str = "auto", device=None) -> list[list[dict]]:
    """The ``k`` best memories of the store file ``path`` for each query (plain top-k, or
    AGPR), as dicts (id, text, timestamp, tenant, score, sources, ...). The queries are
    embedded with the model of the store's vectors (``embedder``: ``auto`` takes the one
    the store records; ``default``: all-MiniLM-L6-v2; or a local model folder). ``tenant``
    limits the search to one tenant (needed when the store holds several)."""
    cfg = RetrievalConfig(k=k, agpr=agpr)
    detect_format(os.fspath(path), None, flag=None)
    store, emb = load_store_and_embedder(path, embedder=embedder, device=device, tenants=tenant, warn=False)
    if emb is None:
        known = f"records {store.embedder!r}, which is not a local model directory" if store.embedder else \
            "does not record the model of its vectors"
        raise OptionError(f"the query must be embedded by the model that made the store's vectors, and the store "
                          f"{known}: pass {{embedder=PATH}} (or {{embedder=default}} if they are all-MiniLM-L6-v2)")
    if emb.dim != store.dim:
        raise OptionError(f"{{embedder}}'s dimension must match the store's ({store.dim}), got {emb.dim} "
                          f"from {emb.name!r}")
    return Retriever(store).search(emb.embed(list(queries)), tenants=tenant, config=cfg).hits(store)
