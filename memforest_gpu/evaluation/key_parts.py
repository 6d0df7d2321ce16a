"""Cutting a merged node into its sources' parts from what a compressed store holds (issue 38).

:mod:`.context_fill` cuts a merged node into its sources' parts with the originals' texts, which a
compressed store does not hold. :func:`key_split` does it from the store alone, as the product's
context does (:func:`memforest_gpu.retrieval.context.key_parts`: the merged text's sentences,
each with the date tag of its segment, embedded by the store's embedder and given to the key they
are closest to); here each part is labelled by its key's first source, as the originals' parts are
by their source. No originals are read.
"""
from __future__ import annotations

from ..retrieval.context import dated_sentences, key_parts

__all__ = ["key_split", "dated_sentences", "KeySplit"]


class KeySplit:
    """``split(store, j)`` for :func:`~.context_fill.contexts`: node ``j``'s parts (label, date
    tag, sentences) in text order. ``embed``: the store's embedder's ``embed`` (wrap it in a cache);
    :func:`~.context_fill.contexts` hands it to the product's context under ``fill="ranked"``."""

    def __init__(self, embed):
        self.embed = embed

    def __call__(self, store, j: int) -> list[tuple[str | None, str, list[str]]]:
        keys = store.keys
        return [(None if k is None else keys.sources[k].as_py()[0], tag, sents)
                for k, tag, sents in key_parts(store, j, self.embed)]


def key_split(embed) -> KeySplit:
    """:class:`KeySplit` of ``embed(texts) -> (n, D)`` unit rows."""
    return KeySplit(embed)
