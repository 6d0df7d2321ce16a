"""The user-facing Python API: load, compress, save, search (the CLI calls only these)."""
from __future__ import annotations

import logging
from pathlib import Path

from .config import CompressConfig
from .embedders import SentenceTransformerEmbedder, get_embedder
from .engine import CompressResult, compress
from .io import read_store, write_store
from .mergers import get_merger
from .store import MemoryStore

__all__ = ["load_store", "compress_file", "resolve_embedder"]

log = logging.getLogger("memforest_gpu")


def resolve_embedder(spec: str, store_embedder: str | None, *, device=None):
    """``auto`` re-embeds with the store's recorded model when it can be loaded locally,
    else warns and falls back to the normalised mean of the merged vectors."""
    emb = get_embedder(spec, device=device, store_embedder=store_embedder)
    if emb is None and spec == "auto":
        log.warning("the model behind this store's vectors is %s; merged nodes get the normalised mean of "
                    "their inputs' vectors (pass --embedder PATH to re-embed merged text instead)",
                    repr(store_embedder) if store_embedder else "not recorded")
    return emb


def load_store(path: str | Path, *, embedder: str = "auto", device=None, format: str | None = None) -> MemoryStore:
    """Read a store; a file without embeddings is embedded on load (``auto``: the default model)."""
    model = None
    if embedder not in ("none",):
        model = get_embedder("default" if embedder == "auto" else embedder, device=device)
    return read_store(path, format=format, embedder=model, device=device)


def compress_file(src: str | Path, dst: str | Path, config: CompressConfig, *, embedder: str = "auto",
                  merger: str = "extractive", device=None, progress: bool = True, format: str | None = None,
                  out_format: str | None = None) -> CompressResult:
    """Read ``src``, compress, write ``dst`` atomically. Nothing is written on any error."""
    store = load_store(src, embedder=embedder, device=device, format=format)
    emb = resolve_embedder(embedder, store.embedder, device=device)
    result = compress(store, config, merger=get_merger(merger), embedder=emb, device=device, progress=progress)
    write_store(result.store, dst, format=out_format)
    return result
