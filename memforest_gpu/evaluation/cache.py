"""An embedder wrapper that caches vectors by text on disk, so a grid re-run never re-embeds.

Layout of a cache folder (one sub-folder per model)::

    <cache>/<model>/part-<random>.npz    keys (n,) sha1 of each text, vecs (n, D) float32

Each part is written atomically in one file under a fresh random name, so runs sharing
a cache never overwrite each other and a run killed mid-write loses at most its
unflushed vectors. :meth:`CachedEmbedder.flush` writes the vectors computed since the
last flush as one part; many small parts are compacted into one on load.
"""
from __future__ import annotations

import glob
import hashlib
import os
import re
import secrets
import zipfile
from collections.abc import Sequence

import numpy as np
import torch

from ..mergers.embedders import count_words
from ..store.atomic import atomic_open

__all__ = ["CachedEmbedder"]

_COMPACT_AT = 32  # compact when a model's folder holds this many parts


def _key(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


class CachedEmbedder:
    """Wrap an embedder (``name``, ``dim``, ``max_tokens``, ``embed``, ``count_tokens``)
    with an on-disk cache keyed by text. The wrapped model is only touched for texts not
    in the cache (and for token counts, which are memoised in memory).

    >>> emb = CachedEmbedder(SentenceTransformerEmbedder(), "out/.cache")
    >>> emb.embed(texts)   # (N, D), computed once, read back on every later run
    >>> emb.flush()        # write what is new
    """

    def __init__(self, inner, directory: str | os.PathLike | None):
        self.inner = inner
        self.name = inner.name
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(inner.name)).strip("_") or "model"
        self.directory = None if directory is None else os.path.join(os.fspath(directory), safe)
        self._vec: dict[str, np.ndarray] = {}
        self._new: dict[str, np.ndarray] = {}
        self._tok: dict[str, int] = {}
        self.hits = 0
        self.misses = 0
        if self.directory is not None:
            self._load()

    @property
    def dim(self) -> int:
        return int(self.inner.dim)

    @property
    def max_tokens(self):
        return self.inner.max_tokens

    # ------------------------------------------------------------------ disk
    def _parts(self) -> list[str]:
        return sorted(glob.glob(os.path.join(self.directory, "part-*.npz")))

    def _load(self) -> None:
        parts = self._parts()
        for path in parts:
            try:
                with np.load(path) as z:
                    keys, vecs = z["keys"], z["vecs"]
            except (OSError, ValueError, KeyError, zipfile.BadZipFile):
                continue  # unreadable, or removed by a concurrent compaction: skip it
            if vecs.ndim != 2 or len(keys) != vecs.shape[0]:
                continue
            for k, row in zip(keys.tolist(), vecs):
                self._vec[k.decode("ascii")] = row
        if len(parts) >= _COMPACT_AT and self._vec:
            self._write(self._vec)
            for path in parts:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass

    def _write(self, items: dict[str, np.ndarray]) -> None:
        os.makedirs(self.directory, exist_ok=True)
        keys = list(items)
        vecs = np.stack([items[k] for k in keys]).astype(np.float32)
        path = os.path.join(self.directory, f"part-{secrets.token_hex(8)}.npz")
        with atomic_open(path) as f:
            np.savez(f, keys=np.array([k.encode("ascii") for k in keys], dtype="S40"), vecs=vecs)

    def flush(self) -> int:
        """Write vectors computed since the last flush as a new part; returns how many (0
        without a folder)."""
        n = len(self._new) if self.directory is not None else 0
        if n:
            self._write(self._new)
        self._new.clear()
        return n

    # -------------------------------------------------------------- embedder
    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        """Shape: (N,) texts -> (N, D) float32 (CPU), rows L2-normalised."""
        texts = list(texts)
        if not texts:
            return torch.empty(0, self.dim, dtype=torch.float32)
        keys = [_key(t) for t in texts]
        todo: dict[str, str] = {}
        for k, t in zip(keys, texts):
            if k not in self._vec and k not in todo:
                todo[k] = t
        self.misses += len(todo)
        self.hits += len(texts) - len(todo)
        if todo:
            out = self.inner.embed(list(todo.values())).detach().to("cpu", torch.float32).numpy()
            for k, row in zip(todo, out):
                self._vec[k] = row
                self._new[k] = row
        return torch.from_numpy(np.stack([self._vec[k] for k in keys]))

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """The wrapped model's token counts, memoised by text."""
        texts = list(texts)
        todo = list(dict.fromkeys(t for t in texts if t not in self._tok))
        if todo:
            counter = getattr(self.inner, "count_tokens", None)
            if counter is None:
                counter = count_words
            self._tok.update(zip(todo, counter(todo)))
        return [self._tok[t] for t in texts]
