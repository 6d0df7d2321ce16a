"""One merger call for a whole round, with the rules that keep every memory.

Anything the merger cannot deliver (an exception, a wrong count, an empty text, a text over
the node-token cap) is merged again by the extractive merger: never "keep one text, delete
the other" (SPEC section 3). A merger marked ``fatal`` (a backend that is down as a whole)
or the extractive merger itself failing stops the run instead.
"""
from __future__ import annotations

import logging
from typing import Callable, Sequence

from .mergers.base import MergePair

__all__ = ["merge_round"]

log = logging.getLogger("memforest_gpu")


def merge_round(merger, fallback, pairs: Sequence[MergePair], *, counter: Callable | None = None,
                cap: int | None = None) -> tuple[list[str], list[int] | None, int]:
    """Merged texts for ``pairs``, their token counts (when ``counter`` is given) and how
    many came from the fallback merger."""
    pairs = list(pairs)
    texts, n_fb = _call(merger, fallback, pairs)
    tokens = counter(texts) if counter is not None else None
    if cap is not None and tokens is not None and merger is not fallback:
        over = [j for j, c in enumerate(tokens) if c > cap]
        if over:
            fixed = fallback.merge([pairs[j] for j in over])
            for j, tx, c in zip(over, fixed, counter(fixed)):
                texts[j], tokens[j] = tx, c
            n_fb += len(over)
    return texts, tokens, n_fb


def _call(merger, fallback, pairs: list[MergePair]) -> tuple[list[str], int]:
    try:
        texts = list(merger.merge(pairs))
        if len(texts) != len(pairs):
            raise ValueError(f"merger must return one text per pair ({len(pairs)}), got {len(texts)}")
    except Exception as e:  # noqa: BLE001 - an LLM backend failing must never lose memories
        if merger is fallback or getattr(merger, "fatal", False):
            raise  # the extractive merger itself, or a backend (or its journal) that is down as a whole
        log.warning("merger %r failed on a batch of %d pairs (%s); using the extractive merger",
                    getattr(merger, "name", merger), len(pairs), e)
        return fallback.merge(pairs), len(pairs)
    bad = [j for j, t in enumerate(texts) if not isinstance(t, str) or not t.strip()]
    if bad:
        for j, t in zip(bad, fallback.merge([pairs[j] for j in bad])):
            texts[j] = t
    return texts, len(bad)
