"""docs/evaluation.md's metrics over retrieved context: AnsR, EvR and Ctx (plus Dates), at ``@k``
and ``@B``.

A retrieved node is rendered as ``"[{date}] {text}"``. Two cuts of a ranked list:

- ``k``: the top ``k`` nodes;
- ``B``: nodes in rank order until ``B`` whitespace tokens are used, the last one cut to fit.

Per question:

- **AnsR**: the fraction of the answer's distinct tokens (lowercase alphanumeric runs,
  minus :data:`STOP_WORDS`) found among the context's tokens. An answer with no token
  left is scored on its tokens with stop words kept; one with no token at all is NaN.
- **AnsR-content** (``ansr_content``): the same, but a token is credited only from node
  text (date headers and merged text's date tags removed) and from the dates of nodes
  that hold evidence of the question (at ``B``: evidence whose text starts before the
  cut). The date headers of unrelated nodes supply most of a temporal answer's day,
  month and year tokens; this version does not reward showing many dates.
- **EvR**: the fraction of the evidence ids found in the ``sources`` of the context's
  nodes; NaN for a question without evidence. At ``B`` it is strict: in the node that
  was cut, a source counts only when its text starts before the cut.
- **Ctx**: whitespace tokens in the context.
- **Dates**: distinct dates written in the context (node headers and the date tags of
  merged text; at ``B`` only tags that start before the cut). A diagnostic for temporal
  questions, whose answers are mostly dates: a context that shows more dates can match an
  answer's date tokens without the evidence (read it next to EvR).

Where a source's text starts inside a merged node (:func:`source_starts`): at the first
of its sentences, in order, found verbatim in the merged text. The extractive merger
keeps sentences verbatim, so this is exact unless the merger removed the sentence; an
exact duplicate then counts at the identical sentence that replaced it (found by the
same search), and a source none of whose sentences is found verbatim (near duplicates
only, or an LLM merger's rewrite) counts at the end of the node: conservatively, it is
credited only when the whole node fits in the budget.
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..sentences import split_sentences
from ..store.memory_store import MemoryStore
from ..store.timeutil import DATE_TAG, format_date

__all__ = ["STOP_WORDS", "tokens", "answer_tokens", "option_tokens", "render", "source_starts", "NodeViews",
           "score_ranked", "METRICS", "CUTS"]

STOP_WORDS = frozenset(
    "a an the and or but of to in on at for with by from as is are was were be been being it its "
    "this that these those he she they them his her their i you we me my our your do does did has have had "
    "so than then there what which who whom whose".split())
METRICS = ("ansr", "ansr_content", "evr", "ctx", "dates")
CUTS = ("k", "B")
_TOKEN = re.compile(r"[a-z0-9]+")
_WS = re.compile(r"\S+")


def tokens(text: str) -> list[str]:
    """Lowercase alphanumeric runs: ``"Mel's 2 dogs!" -> ['mel', 's', '2', 'dogs']``."""
    return _TOKEN.findall(text.lower())


def answer_tokens(answer: str) -> frozenset[str]:
    """The answer's distinct tokens without stop words (with them, if nothing else is left)."""
    toks = tokens(str(answer))
    kept = frozenset(t for t in toks if t not in STOP_WORDS)
    return kept or frozenset(toks)


def option_tokens(answer: str, options) -> frozenset[str]:
    """A multiple-choice answer's distinctive tokens: the correct option's tokens (as
    :func:`answer_tokens`) that no other option has; all of them when none is distinctive.
    AnsR on these asks whether the context holds what tells the right option from the others."""
    own = answer_tokens(answer)
    others: set[str] = set()
    for o in options:
        if o != answer:
            others |= set(tokens(str(o)))
    return frozenset(own - others) or own


def render(text: str, timestamp: float) -> str:
    """A retrieved node as context: ``"[8 May 2023] {text}"``."""
    return f"[{format_date(timestamp)}] {text}"


def source_starts(text: str, sources: Sequence[str], original_text: dict[str, str]) -> dict[str, int]:
    """Character offset in ``text`` where each source's text starts (see module doc);
    ``len(text)`` when none of its sentences is found verbatim."""
    if len(sources) == 1:
        return {sources[0]: 0}
    out = {}
    for s in sources:
        pos = len(text)
        for sent in split_sentences(original_text.get(s, "")):
            p = text.find(sent)
            if p >= 0:
                pos = p
                break
        out[s] = pos
    return out


@dataclass
class NodeViews:
    """Everything the metrics need about a store's nodes, computed once per store.

    ``ws_end[j]`` are the character offsets where each whitespace token of node j's
    rendered text ends; ``starts[j]`` maps each source to its offset in the rendered text;
    ``dates[j]`` lists ``(offset, "8 May 2023")`` for each date tag in the rendered text;
    ``content[j]`` is the rendered text with every date tag blanked (same offsets), and
    ``content_tok[j]`` / ``date_tok[j]`` its tokens / the tokens of its dates.
    """

    rendered: list[str]
    ws_end: list[np.ndarray]
    tok: list[frozenset[str]]
    sources: list[list[str]]
    starts: list[dict[str, int]]
    dates: list[list[tuple[int, str]]]
    content: list[str]
    content_tok: list[frozenset[str]]
    date_tok: list[frozenset[str]]

    @classmethod
    def build(cls, store: MemoryStore, original_text: dict[str, str]) -> NodeViews:
        ts = store.timestamps.detach().cpu().tolist()
        rendered, ws_end, tok, starts, dates, content, content_tok, date_tok = [], [], [], [], [], [], [], []
        for text, t, src in zip(store.texts, ts, store.sources):
            r = render(text, t)
            off = len(r) - len(text)
            rendered.append(r)
            ws_end.append(np.fromiter((m.end() for m in _WS.finditer(r)), dtype=np.int64))
            tok.append(frozenset(tokens(r)))
            starts.append({s: off + p for s, p in source_starts(text, src, original_text).items()})
            dates.append([(m.start(), " ".join(m.groups())) for m in DATE_TAG.finditer(r)])
            c = DATE_TAG.sub(lambda m: " " * len(m.group()), r)
            content.append(c)
            content_tok.append(frozenset(tokens(c)))
            date_tok.append(frozenset(t for _, d in dates[-1] for t in tokens(d)))
        return cls(rendered, ws_end, tok, [list(s) for s in store.sources], starts, dates, content, content_tok,
                   date_tok)


def score_ranked(ranked: np.ndarray, views: NodeViews, answers: Sequence[frozenset[str]],
                 evidence: Sequence[frozenset[str]], *, k: int = 10, max_tokens: int = 256) -> dict[tuple[str, str],
                                                                                                np.ndarray]:
    """Per-question metrics of ranked lists.

    Shape: ranked (Q, C) node index per rank (-1 = none) -> {(cut, metric): (Q,) float64}
    """
    Q = ranked.shape[0]
    out = {(c, m): np.full(Q, np.nan) for c in CUTS for m in METRICS}
    for q in range(Q):
        row = [int(j) for j in ranked[q] if j >= 0]
        ans, ev = answers[q], evidence[q]
        # @k
        top = row[:k]
        ctx_tok: set[str] = set().union(*(views.tok[j] for j in top)) if top else set()
        src: set[str] = set().union(*(views.sources[j] for j in top)) if top else set()
        out["k", "ctx"][q] = sum(len(views.ws_end[j]) for j in top)
        out["k", "dates"][q] = len({d for j in top for _, d in views.dates[j]})
        if ans:
            out["k", "ansr"][q] = len(ans & ctx_tok) / len(ans)
            content: set[str] = set()
            for j in top:
                content |= views.content_tok[j]
                if ev and not ev.isdisjoint(views.sources[j]):
                    content |= views.date_tok[j]
            out["k", "ansr_content"][q] = len(ans & content) / len(ans)
        if ev:
            out["k", "evr"][q] = len(ev & src) / len(ev)
        # @B
        used = 0
        ctx_tok = set()
        src = set()
        dates = set()
        content = set()
        for j in row:
            n = len(views.ws_end[j])
            if used + n <= max_tokens:
                used += n
                ctx_tok |= views.tok[j]
                src.update(views.sources[j])
                dates.update(d for _, d in views.dates[j])
                content |= views.content_tok[j]
                if ev and not ev.isdisjoint(views.sources[j]):
                    content |= views.date_tok[j]
                if used == max_tokens:
                    break
                continue
            take = max_tokens - used
            if take > 0:
                cut = int(views.ws_end[j][take - 1])
                ctx_tok.update(tokens(views.rendered[j][:cut]))
                shown = {s for s, p in views.starts[j].items() if p < cut}
                src.update(shown)
                dates.update(d for p, d in views.dates[j] if p < cut)
                content.update(tokens(views.content[j][:cut]))
                if ev and not ev.isdisjoint(shown):
                    content.update(t for p, d in views.dates[j] if p < cut for t in tokens(d))
                used += take
            break
        out["B", "ctx"][q] = used
        out["B", "dates"][q] = len(dates)
        if ans:
            out["B", "ansr"][q] = len(ans & ctx_tok) / len(ans)
            out["B", "ansr_content"][q] = len(ans & content) / len(ans)
        if ev:
            out["B", "evr"][q] = len(ev & src) / len(ev)
    return out


def nanmean(x: np.ndarray) -> float:
    x = np.asarray(x, dtype=np.float64)
    ok = ~np.isnan(x)
    return float(x[ok].mean()) if ok.any() else math.nan
