"""Filling the context budget with the part of a merged node that matched (issue 38).

EVAL.md's ``@B`` cut shows nodes in rank order, each rendered ``"[date] text"``, and cuts the
last one to fit the budget. A merged node's text is its sources' sentences in time order, so a
long merged node that ranks first because of one source can fill the budget with the sources
before it, the one that matched cut off. ``fill="matched"`` renders each merged node *for the
question*: its sources in the order of their match to the question, each with its sentences
kept verbatim in the merged text and its date tag, so a cut drops the sources that matched least.

- A source's match: the cosine of the question to the key that holds it (a store with keys,
  docs/merged-keys.md: the source's own vector, or the centre of its cluster); in a store without
  keys (one vector per memory), the share of the question's tokens (stop words out) found in the
  source's original text. Ties go to the newer source, so of two equally matching values of a
  changed fact the newest comes first (with its date).
- A source's part: the sentences of its original text found verbatim in the merged text that
  no earlier part showed, preceded by ``[date]`` when its date is not the one written last; the
  first part's tag is the node's header (the protocol writes the node's date, then the merged
  text's first tag). Sentences of the merged text that no source claims (a sentence cut to
  fit the node cap) come last. A source with no sentence left (merged away as a duplicate, or
  dropped by condensing) starts at the end of the rendered text, as in :func:`~.metrics.source_starts`.
- Nothing is dropped and nothing is added but date tags: the rendered node holds the merged
  text's sentences, reordered. Originals (one source) render as before.

:func:`contexts` gives each question's context (nodes and where each was cut) under either fill;
:func:`score_contexts` scores it exactly as :func:`~.metrics.score_ranked` scores ``@B``
(``fill="plain"`` gives the same numbers: ``tests/test_long_memories.py``).
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..mergers.extractive import split_sentences
from ..store.timeutil import DATE_TAG, format_date
from .metrics import STOP_WORDS, NodeViews, tokens

__all__ = ["View", "view_of", "stored_view", "matched_render", "source_scores", "contexts", "score_contexts",
           "FILLS"]

FILLS = ("plain", "matched")
_WS = re.compile(r"\S+")


@dataclass(frozen=True)
class View:
    """One rendered node, as :class:`~.metrics.NodeViews` holds it per node."""

    rendered: str
    ws_end: np.ndarray
    tok: frozenset
    sources: list
    starts: dict
    dates: list
    content: str
    content_tok: frozenset
    date_tok: frozenset


def view_of(rendered: str, sources: Sequence[str], starts: dict[str, int]) -> View:
    """The :class:`View` of a rendered text whose sources start at ``starts``."""
    dates = [(m.start(), " ".join(m.groups())) for m in DATE_TAG.finditer(rendered)]
    content = DATE_TAG.sub(lambda m: " " * len(m.group()), rendered)
    return View(rendered, np.fromiter((m.end() for m in _WS.finditer(rendered)), dtype=np.int64),
                frozenset(tokens(rendered)), list(sources), starts, dates, content, frozenset(tokens(content)),
                frozenset(t for _, d in dates for t in tokens(d)))


def stored_view(views: NodeViews, j: int) -> View:
    """Node ``j`` of ``views`` as a :class:`View` (no copy of its arrays)."""
    return View(views.rendered[j], views.ws_end[j], views.tok[j], views.sources[j], views.starts[j], views.dates[j],
                views.content[j], views.content_tok[j], views.date_tok[j])


def matched_render(text: str, timestamp: float, sources: Sequence[str], scores: dict[str, float],
                   original_text: dict[str, str], original_ts: dict[str, float]) -> tuple[str, dict[str, int]]:
    """A merged node rendered for one question (module doc): (rendered text, each source's start)."""
    out: list[str] = []
    pos, last = -1, None  # the first part's tag is the node's header (no second tag)
    starts: dict[str, int] = {}
    shown: set[str] = set()
    order = sorted(sources, key=lambda s: (-scores.get(s, -math.inf), -original_ts.get(s, 0.0)))
    for s in order:
        sents = [x for x in split_sentences(original_text.get(s, "")) if x not in shown and x in text]
        if not sents:
            continue
        tag = f"[{format_date(original_ts.get(s, timestamp))}]"
        if tag != last:
            out.append(tag)
            pos += 1 + len(tag)
            last = tag
        starts[s] = pos + 1
        for x in sents:
            out.append(x)
            pos += 1 + len(x)
            shown.add(x)
    if not out:
        out.append(f"[{format_date(timestamp)}]")
    out += [x for x in split_sentences(DATE_TAG.sub("\n", text)) if x not in shown]
    rendered = " ".join(out)
    return rendered, {s: starts.get(s, len(rendered)) for s in sources}


def source_scores(store, j: int, q_vec: torch.Tensor | None, question_tokens: frozenset,
                  original_text: dict[str, str]) -> dict[str, float]:
    """Each source of node ``j``'s match to a question (module doc): its key's cosine, or the
    share of the question's tokens in its text when the store has no keys."""
    keys = store.keys
    srcs = list(store.sources[j])
    if keys is not None and q_vec is not None and keys.counts[j] > 0:
        lo, hi = int(keys.offsets[j]), int(keys.offsets[j + 1])
        cos = (keys.unit(torch.arange(lo, hi)) @ q_vec.float().cpu()).tolist()
        out = {}
        for c, members in zip(cos, keys.sources[lo:hi].to_pylist()):
            out.update({s: c for s in members})
        return out
    n = max(1, len(question_tokens))
    return {s: len(question_tokens & set(tokens(original_text.get(s, "")))) / n for s in srcs}


def contexts(ranked: np.ndarray, store, views: NodeViews, budget: int, *, fill: str = "plain",
             q_emb: torch.Tensor | None = None, questions: Sequence[str] = (), original_text=None,
             original_ts=None) -> list[list[tuple[int, View, int | None]]]:
    """Each question's ``@B`` context: (node, its view, the character where it was cut or None
    when shown whole), in rank order. ``fill="matched"`` renders merged nodes for the question
    (needs ``q_emb`` (Q, D) or ``questions``' texts for a store without keys, ``original_text``
    and ``original_ts``: id -> text / timestamp of the originals)."""
    if fill not in FILLS:
        raise ValueError(f"fill must be one of {list(FILLS)}, got {fill!r}")
    out = []
    for q, row in enumerate(ranked):
        used, ctx = 0, []
        qtok = frozenset(t for t in tokens(questions[q]) if t not in STOP_WORDS) if len(questions) else frozenset()
        for j in (int(x) for x in row if x >= 0):
            if used >= budget:
                break
            v = stored_view(views, j)
            if fill == "matched" and len(v.sources) > 1:
                sc = source_scores(store, j, None if q_emb is None else q_emb[q], qtok, original_text)
                rendered, starts = matched_render(store.texts[j], float(store.timestamps[j]), v.sources, sc,
                                                  original_text, original_ts)
                v = view_of(rendered, v.sources, starts)
            n = len(v.ws_end)
            if used + n <= budget:
                ctx.append((j, v, None))
                used += n
                continue
            ctx.append((j, v, int(v.ws_end[budget - used - 1])))
            used = budget
        out.append(ctx)
    return out


def score_contexts(ctxs, answers: Sequence[frozenset], evidence: Sequence[frozenset]) -> dict[str, np.ndarray]:
    """``@B`` metrics of :func:`contexts`, as :func:`~.metrics.score_ranked` computes them:
    {"ansr", "ansr_content", "evr", "ctx", "dates"} -> (Q,) float64."""
    Q = len(ctxs)
    out = {m: np.full(Q, np.nan) for m in ("ansr", "ansr_content", "evr", "ctx", "dates")}
    for q, ctx in enumerate(ctxs):
        ans, ev = answers[q], evidence[q]
        tok, src, dates, content = set(), set(), set(), set()
        used = 0
        for _, v, cut in ctx:
            if cut is None:
                used += len(v.ws_end)
                tok |= v.tok
                src.update(v.sources)
                dates.update(d for _, d in v.dates)
                content |= v.content_tok
                if ev and not ev.isdisjoint(v.sources):
                    content |= v.date_tok
                continue
            used += int(np.searchsorted(v.ws_end, cut, side="right"))
            tok.update(tokens(v.rendered[:cut]))
            shown = {s for s, p in v.starts.items() if p < cut}
            src.update(shown)
            dates.update(d for p, d in v.dates if p < cut)
            content.update(tokens(v.content[:cut]))
            if ev and not ev.isdisjoint(shown):
                content.update(t for p, d in v.dates if p < cut for t in tokens(d))
        out["ctx"][q] = used
        out["dates"][q] = len(dates)
        if ans:
            out["ansr"][q] = len(ans & tok) / len(ans)
            out["ansr_content"][q] = len(ans & content) / len(ans)
        if ev:
            out["evr"][q] = len(ev & src) / len(ev)
    return out
