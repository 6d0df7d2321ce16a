"""The Python API of store files: load, compress, compact, search. The command line calls
these for its store commands; each is a thin door to the package that does the work.

>>> from memforest_gpu.api import compress_file, search_file
>>> result = compress_file("memories.parquet", "compressed.parquet",
...     CompressConfig.preset("memforest"))
>>> hits = search_file("compressed.parquet", ["where did Alice travel?"], k=5)[0]
"""
from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from .config import CompressConfig, RetrievalConfig
from .engine import CompressResult
from .renamed import renamed_keyword
from .retrieval.context import FILLS, MIN_CONTEXT_TOKENS
from .retrieval.retriever import CONTEXT_DEPTH, Retriever
from .runs.budgeted import compress_file_budgeted
from .runs.compact_run import compact_file
from .runs.errors import OptionError
from .runs.loading import RunInterrupted, load_store, load_store_and_embedder, resolve_embedder
from .runs.single import compress_in_memory, dry_run_file
from .store.io import detect_format, read_store, write_store

__all__ = ["load_store", "load_store_and_embedder", "resolve_embedder", "read_store", "write_store",
           "compress_file", "dry_run_file", "compact_file", "search_file", "RunInterrupted"]

log = logging.getLogger("memforest_gpu")


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


def search_file(path: str | Path, queries: Sequence[str], *, k: int | None = None, agpr: bool = False,
                tenant: str | None = None, embedder: str = "auto", device=None, max_tokens: int | None = None,
                fill: str | None = None, **renamed) -> list[list[dict]]:
    """The ``k`` best memories (default 10) of the store file ``path`` for each query (plain top-k,
    or AGPR), as dicts (id, text, timestamp, tenant, score, sources, ...). The queries are
    embedded with the model of the store's vectors (``embedder``: ``auto`` takes the one
    the store records; ``default``: all-MiniLM-L6-v2; or a local model folder). ``tenant``
    limits the search to one tenant (needed when the store holds several); a ``k`` above the nodes
    it holds is cut to them, with one warning. With ``max_tokens``: the
    context instead, pieces (id, sources, text with its date tag, score, cut) filling ``max_tokens``
    whitespace tokens from the best ``k`` hits (default 40), by ``fill`` (``ranked``: the parts of
    merged nodes that matched first, the default for a store with keys; ``plain``: whole nodes in
    rank order; :mod:`memforest_gpu.retrieval.context`). ``budget=``: the old name of
    ``max_tokens``."""
    max_tokens = renamed_keyword("search_file", renamed, "budget", "max_tokens", max_tokens)
    if max_tokens is None and fill is not None:
        raise OptionError(f"{{fill}} needs {{max_tokens}} (whitespace tokens of context), got fill {fill!r}")
    if fill is not None and fill not in FILLS:
        raise OptionError(f"{{fill}} must be one of {', '.join(FILLS)}, got {fill!r}")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                   or max_tokens < MIN_CONTEXT_TOKENS):
        raise OptionError(f"{{max_tokens}} must be an integer >= {MIN_CONTEXT_TOKENS} (whitespace tokens; a piece's "
                          f"date tag takes 3), got {max_tokens!r}")
    cfg = RetrievalConfig(k=k if k is not None else 10 if max_tokens is None else CONTEXT_DEPTH, agpr=agpr)
    detect_format(os.fspath(path), None, flag=None)
    store, emb = load_store_and_embedder(path, embedder=embedder, device=device, tenants=tenant, warn=False)
    names = store.tenant_names()
    if tenant is None and len(names) > 1:  # before the query is embedded (cli/tenants.py: a Parquet store sooner)
        shown = str(names) if len(names) <= 20 else f"{names[:20]}... ({len(names)} tenants)"
        raise OptionError(f"{{tenant}} must be given for a store with several tenants, one of {shown}")
    if emb is None:
        known = f"records {store.embedder!r}, which is not a local model directory" if store.embedder else \
            "does not record the model of its vectors"
        raise OptionError(f"the query must be embedded by the model that made the store's vectors, and the store "
                          f"{known}: pass {{embedder=PATH}} (or {{embedder=default}} if they are all-MiniLM-L6-v2)")
    if emb.dim != store.dim:
        raise OptionError(f"{{embedder}}'s dimension must match the store's ({store.dim}), got {emb.dim} "
                          f"from {emb.name!r}")
    if cfg.k > len(store):  # the result holds k rows per query: never more than there are nodes
        if k is not None:
            log.warning("{k=%d} is more than the %d nodes %s holds: showing at most %d", k, len(store),
                        "the store" if tenant is None else f"tenant {tenant!r}", len(store))
        cfg = dataclasses.replace(cfg, k=max(1, len(store)))
    qe = emb.embed(list(queries))
    res = Retriever(store).search(qe, tenants=tenant, config=cfg)
    if max_tokens is None:
        return res.hits(store)
    return res.context(store, qe, max_tokens=max_tokens, fill=fill, embedder=emb)
