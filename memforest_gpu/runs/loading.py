"""Reading a store file with the model of its vectors: what every file command starts with."""
from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

from ..mergers.embedders import SentenceTransformerEmbedder, get_embedder
from ..store.io import read_store
from ..store.memory_store import MemoryStore
from .errors import OPTION_WORDS  # noqa: F401 (the logger's filter writes {embedder=PATH} in the caller's words)

__all__ = ["load_store", "load_store_and_embedder", "resolve_embedder", "RunInterrupted", "NoEmbeddingsError"]

log = logging.getLogger("memforest_gpu")


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a file run (compress, compact): ``what`` was kept; ``resumable``: the
    message says how to continue (``resume=True``; a command names its flag, :meth:`message`)."""

    def __init__(self, what: str, *, resumable: bool = False):
        self.what, self.resumable = what, resumable
        super().__init__(self.message("call again with resume=True"))

    def message(self, resume: str) -> str:
        """The message, saying ``resume`` (how to resume) when the run can be resumed."""
        return f"{self.what}: {resume} to continue from them" if self.resumable else self.what


class NoEmbeddingsError(ValueError):
    """A store file without vectors read with ``embedder="none"`` (no model to embed it);
    ``path``."""

    def __init__(self, path: str | Path):
        self.path = os.fspath(path)
        super().__init__(f"{self.path}: the store has no embeddings, so embedder 'none' cannot be used; pass "
                         "embedder 'auto' (all-MiniLM-L6-v2), 'default' or a model directory to embed it")


class _Refused(Exception):
    """Raised by :class:`_NoEmbedder` (not a ValueError: it passes the reader's own wrapping)."""


class _NoEmbedder:
    """``embedder="none"`` while reading: a file without vectors asks it to embed, and it
    refuses."""

    name = None

    def embed(self, texts):
        raise _Refused


def resolve_embedder(spec: str, store_embedder: str | None, *, device=None):
    """``auto`` re-embeds with the store's recorded model when it can be loaded locally,
    else warns and falls back to the normalised mean of the merged vectors."""
    emb = get_embedder(spec, device=device, store_embedder=store_embedder)
    if emb is None and spec == "auto":
        _warn_mean(store_embedder)
    return emb


def _warn_mean(store_embedder: str | None) -> None:
    log.warning("the model behind this store's vectors is %s; merged nodes get the normalised mean of "
                "their inputs' vectors (pass {embedder=PATH}, the model that made them, to re-embed merged "
                "text instead)", repr(store_embedder) if store_embedder else "not recorded")


def load_store_and_embedder(path: str | Path, *, embedder: str = "auto", device=None, format: str | None = None,
                            tenants=None, warn: bool = True) -> tuple[MemoryStore, object]:
    """Read a store and resolve the model of its vectors, loading at most one model.

    ``embedder``:
    - ``auto``: a file without vectors is embedded with all-MiniLM-L6-v2 (the returned
      embedder); a file whose vectors record a model gets that model when it is the
      default one or a local directory; a file whose vectors record no model, or one that
      cannot be loaded, gets ``None`` (merged nodes: the normalised mean) and, with
      ``warn``, one warning saying how to re-embed. Unrecorded vectors are never assumed
      to be all-MiniLM-L6-v2.
    - ``default`` / a model directory: that model embeds a file without vectors and is
      taken as the model of a file's vectors (recorded in the store when the file has none).
    - ``none``: no model; the file must hold vectors.
    """
    if embedder == "none":
        try:
            return read_store(path, format=format, embedder=_NoEmbedder(), device=device, tenants=tenants), None
        except _Refused:
            raise NoEmbeddingsError(path) from None
    if embedder == "auto":
        reader = SentenceTransformerEmbedder(device=device)  # loads only if it embeds something
        store = read_store(path, format=format, embedder=reader, device=device, tenants=tenants)
        if store.embedder == reader.name:
            return store, reader  # embedded on load, or the file records the default model: one model
        emb = get_embedder("auto", device=device, store_embedder=store.embedder)
        if emb is None and warn:
            _warn_mean(store.embedder)
        return store, emb
    model = get_embedder(embedder, device=device)
    store = read_store(path, format=format, embedder=model, device=device, tenants=tenants)
    if store.embedder is None:
        store = dataclasses.replace(store, embedder=model.name)  # the caller named the vectors' model
    return store, model


def load_store(path: str | Path, *, embedder: str = "auto", device=None, format: str | None = None) -> MemoryStore:
    """Read a store; a file without embeddings is embedded on load (``auto``: the default
    model). See :func:`load_store_and_embedder`."""
    return load_store_and_embedder(path, embedder=embedder, device=device, format=format, warn=False)[0]
