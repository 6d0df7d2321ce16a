"""One merger call for a whole round, with the rules that keep every memory.

Anything the merger cannot deliver (an exception, a wrong count, an empty text, a text over
the node-token cap) is merged again by the extractive merger: never "keep one text, delete
the other" (docs/method.md section 3). A merger marked ``fatal`` (a backend that is down as a whole)
or the extractive merger itself failing stops the run instead.

Cap policies (``MergeConfig.cap_policy``): ``"strict"`` keeps the extractive merger's text
whatever its length (the planner only pairs nodes whose merge fits) and replaces another
merger's over-cap text by the extractive merge. ``"keep"`` keeps every text whole, whatever its
length (the embedder reads what fits its window; keys find the rest). ``"condense"`` cuts every
text over the cap
to it with :meth:`ExtractiveMerger.condense`: the extractive merger's own text (not
counted as a fallback; also when a journal wraps it) and the extractive replacement of
another merger's over-cap or unusable text.

The engine and the merging baselines set a run up the same way: :func:`with_fallback` (the
merger and the extractive fallback) and :func:`cap_and_counter` (the node-token cap and how
texts are counted against it).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from ..config import CAP_POLICIES
from ..mergers.base import MergePair, unwrap
from ..mergers.extractive import ExtractiveMerger
from ..mergers.word_count import count_words, count_words_arrow, text_blocks

__all__ = ["merge_texts", "RoundTexts", "with_fallback", "cap_and_counter", "count_column"]

class RoundTexts(NamedTuple):
    texts: list[str]  # one merged text per pair
    tokens: list[int] | None  # their token counts (when a counter is given)
    fallbacks: int  # texts made by the fallback merger instead of the merger
    dropped: list[int]  # tokens condensing dropped from each merge (0: kept whole)

log = logging.getLogger("memforest_gpu")


def with_fallback(merger) -> tuple[object, ExtractiveMerger]:
    """(merger, fallback): ``merger`` (the extractive merger when ``None``) and the merger
    that redoes what it cannot deliver: the extractive merger, ``merger`` itself when it is one."""
    merger = merger if merger is not None else ExtractiveMerger()
    return merger, merger if isinstance(merger, ExtractiveMerger) else ExtractiveMerger()


def cap_and_counter(max_node_tokens: int | None, embedder, *,
                    count: bool = False) -> tuple[int | None, Callable | None]:
    """(cap, counter): the node-token cap, ``max_node_tokens`` or else the embedder's limit
    (``None`` without either), and how texts are counted against it, the embedder's tokenizer
    or else words (``None`` when there is no cap, unless ``count``)."""
    cap = max_node_tokens
    if cap is None and embedder is not None:
        cap = embedder.max_tokens
    counter = (getattr(embedder, "count_tokens", None) or count_words) if cap is not None or count else None
    return cap, counter


def count_column(counter: Callable, texts, *, block: int = 1 << 16) -> np.ndarray:
    """``counter`` over a store's text column (an Arrow-backed view): the word counter with
    vectorised kernels (:func:`~memforest_gpu.mergers.word_count.count_words_arrow`), any other
    counter (a tokenizer) ``block`` texts at a time (fewer where they pass 8 MiB), so no Python
    list of every text is built.

    Shape: (N,) -> (N,) int64
    """
    if counter is count_words and hasattr(texts, "arrow"):
        return count_words_arrow(texts)
    out = np.empty(len(texts), dtype=np.int64)
    arr = getattr(texts, "arrow", None)
    if isinstance(arr, pa.Array) and (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        ranges = text_blocks(arr, block)  # long texts: fewer at once (a tokenizer's lists are ~40 bytes a token)
    else:
        ranges = ((lo, min(len(texts), lo + block)) for lo in range(0, len(texts), block))
    for lo, hi in ranges:
        out[lo:hi] = counter(texts[lo:hi])
    return out


def merge_texts(merger, fallback, pairs: Sequence[MergePair], *, counter: Callable | None = None,
                cap: int | None = None, cap_policy: str = "strict") -> RoundTexts:
    """The merged texts of ``pairs`` (one merger call) under a cap policy (module docstring):
    their token counts (when ``counter`` is given), how many the fallback merger made, and
    the tokens each merge lost to condensing."""
    if cap_policy not in CAP_POLICIES:
        raise ValueError(f"cap_policy must be one of {list(CAP_POLICIES)}, got {cap_policy!r}")
    pairs = list(pairs)
    dropped = [0] * len(pairs)
    if cap_policy == "keep":  # no cap on the text (docs/long-memories.md)
        cap = None
    if cap_policy == "condense" and cap is not None and counter is not None:
        return _condensed(merger, fallback, pairs, counter, cap, dropped)
    texts, fb = _call(merger, fallback, pairs)
    n_fb = len(fb)
    tokens = counter(texts) if counter is not None else None
    if cap is not None and tokens is not None and merger is not fallback:
        over = [j for j, c in enumerate(tokens) if c > cap]
        if over:
            fixed = fallback.merge([pairs[j] for j in over])
            for j, tx, c in zip(over, fixed, counter(fixed)):
                texts[j], tokens[j] = tx, c
            n_fb += len(over)
    return RoundTexts(texts, tokens, n_fb, dropped)


def _condensed(merger, fallback, pairs: list[MergePair], counter: Callable, cap: int, dropped: list[int]) -> RoundTexts:
    """``"condense"``: the merger's texts, those over the cap condensed by the extractive merger
    (a fallback unless the merger is the extractive one, alone or in a journal, whose replayed
    full merges are condensed again here)."""
    texts, fb = _call(merger, fallback, pairs)
    redo = [j for j, c in enumerate(counter(texts)) if c > cap]
    if not (merger is fallback or isinstance(unwrap(merger), type(fallback))):
        fb |= set(redo)
    if redo:
        fixed, lost = fallback.condense([pairs[j] for j in redo], cap, counter)
        for j, tx, d in zip(redo, fixed, lost):
            texts[j], dropped[j] = tx, d
    return RoundTexts(texts, counter(texts), len(fb), dropped)


def _call(merger, fallback, pairs: list[MergePair]) -> tuple[list[str], set[int]]:
    """The merger's texts, and which of them the fallback made."""
    try:
        texts = list(merger.merge(pairs))
        if len(texts) != len(pairs):
            raise ValueError(f"merger must return one text per pair ({len(pairs)}), got {len(texts)}")
    except Exception as e:  # noqa: BLE001 - an LLM backend failing must never lose memories
        if merger is fallback or getattr(merger, "fatal", False):
            raise  # the extractive merger itself, or a backend (or its journal) that is down as a whole
        log.warning("merger %r failed on a batch of %d pairs (%s); using the extractive merger",
                    getattr(merger, "name", merger), len(pairs), e)
        return fallback.merge(pairs), set(range(len(pairs)))
    bad = [j for j, t in enumerate(texts) if not isinstance(t, str) or not t.strip()]
    if bad:
        for j, t in zip(bad, fallback.merge([pairs[j] for j in bad])):
            texts[j] = t
    return texts, set(bad)
