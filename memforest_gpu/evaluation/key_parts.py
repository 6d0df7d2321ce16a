"""Cutting a merged node into its sources' parts from what a compressed store holds (issue 38).

:mod:`.context_fill` cuts a merged node into its sources' parts with the originals' texts, which a
compressed store does not hold. :func:`key_split` does it from the store alone: the merged text's
sentences (each with the date tag of its segment) are embedded by the store's embedder and each is
given to the key it is closest to (with every source as a key, the source it most likely came from;
a key that is a centre of several sources stands for them all, labelled by its first). A part is a
key's sentences in text order, dated by its first sentence's segment. No originals are read.
"""
from __future__ import annotations

import torch

from ..mergers.extractive import split_sentences
from ..store.timeutil import DATE_TAG, format_date

__all__ = ["key_split", "dated_sentences"]


def dated_sentences(text: str, timestamp: float) -> list[tuple[str, str]]:
    """(date tag, sentence) of a merged text, in order; text before any tag gets the node's date."""
    out, tag, pos = [], f"[{format_date(timestamp)}]", 0
    for m in DATE_TAG.finditer(text):
        out += [(tag, x) for x in split_sentences(text[pos:m.start()])]
        tag, pos = m.group(), m.end()
    return out + [(tag, x) for x in split_sentences(text[pos:])]


def key_split(embed):
    """``split(store, j)`` for :func:`~.context_fill.contexts`: node ``j``'s parts (label, date tag,
    sentences) in text order, each sentence given to its closest key. ``embed(texts) -> (n, D)``
    unit rows (the store's embedder; wrap it in a cache)."""
    def split(store, j: int) -> list[tuple[str | None, str, list[str]]]:
        sents = dated_sentences(store.texts[j], float(store.timestamps[j]))
        keys = store.keys
        if not sents or keys is None or keys.counts[j] == 0:
            return [(None, sents[0][0] if sents else f"[{format_date(float(store.timestamps[j]))}]",
                     [x for _, x in sents])]
        lo, hi = int(keys.offsets[j]), int(keys.offsets[j + 1])
        K = keys.unit(torch.arange(lo, hi))  # (m, D)
        V = embed([x for _, x in sents]).float().cpu()  # (n, D)
        best = (V @ K.T).argmax(1).tolist()
        labels = [lst[0] for lst in keys.sources[lo:hi].to_pylist()]
        parts: dict[int, tuple[str, list[str]]] = {}
        for (tag, x), k in zip(sents, best):
            parts.setdefault(k, (tag, []))[1].append(x)
        return [(labels[k], tag, xs) for k, (tag, xs) in parts.items()]
    return split
