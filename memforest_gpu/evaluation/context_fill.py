"""Filling the context budget with the part of a merged node that matched (issue 38).

docs/evaluation.md's ``@B`` cut shows nodes in rank order, each rendered ``"[date] text"``, and cuts
the last one to fit the budget. A merged node's text is its sources' sentences by date (newest
first), so a long merged node that ranks first because of one source can fill the budget with the
sources before it, the one that matched cut off. ``fill="matched"`` renders each merged node *for
the question*: its sources in the order of their match to the question, each with its sentences kept
verbatim in the merged text and its date tag, so a cut drops the sources that matched least.

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
  dropped by condensing) starts at the end of the rendered text, as in
  :func:`~.metrics.source_starts`.
- Nothing is dropped and nothing is added but date tags: the rendered node holds the merged
  text's sentences, reordered. Originals (one source) render as before.

``fill="parts"`` goes further: each source's part is shown on its own, breadth first: the best
part of every node in rank order, then the second best part of every node, and so on, until the
budget is spent (the last part cut to fit). Under the same budget the context reaches as many
nodes as an uncompressed store's would, each through the memory that matched, instead of showing
the whole of the first long nodes. Originals are one part, so an uncompressed store gets the
protocol's context under every fill.

``fill="focused"`` is ``"ranked"`` with the last piece, longer than what is left of the budget,
shown by its sentences that match the question best instead of cut to its first tokens (the
product's :func:`~memforest_gpu.retrieval.context.focus`; needs the key split, also for a store
without keys). ``fill="pooled"``: that piece and the 3 after it share what is left, sentence by
sentence (:func:`~memforest_gpu.retrieval.context.focus_many`).

``fill="ranked"`` orders the parts themselves by the store's rule with each part's own key in place
of the node's best key (``w cos(q, text) + (1 - w) cos(q, key)``): a node's second source comes
before another node's first when its key matches the question better. In a store without keys a
node is one piece, as under ``"matched"`` (its parts share the text's score). The rule scores, the
order and the budget's cut are the product's (:mod:`memforest_gpu.retrieval.context`); with the
parts cut by the keys (``split=key_split(...)``, :mod:`.key_parts`) the whole context is the
product's, scored here.

:func:`contexts` gives each question's context (what is shown of which node, and where it was cut);
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

from ..retrieval.context import FILLS, POOL, fit, fit_focused, in_rule_order, part_scores, ranked_pieces
from ..sentences import split_sentences
from ..store.timeutil import DATE_TAG, format_date
from .metrics import STOP_WORDS, NodeViews, source_starts, tokens

__all__ = ["View", "view_of", "stored_view", "matched_render", "source_scores", "contexts", "score_contexts",
           "STUDY_FILLS", "EVAL_FILLS", "node_parts", "join_parts"]

# The product's fills (:data:`memforest_gpu.config.FILLS`, what ``memforest search`` and ``memforest
# eval --fill`` offer) and the two this study adds: "matched" (each merged node reordered by its
# sources' match) and "parts" (sources shown breadth first), scored by :func:`contexts` only.
STUDY_FILLS = ("matched", "parts")
EVAL_FILLS = FILLS + STUDY_FILLS
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


def node_parts(text: str, timestamp: float, sources: Sequence[str], scores: dict[str, float],
               original_text: dict[str, str], original_ts: dict[str, float]) -> list[tuple[str | None, str, list]]:
    """A merged node's parts for one question, best match first (module doc): (source, its date
    tag, its sentences); the sentences no source claims come last as ``(None, node's tag, ...)``."""
    parts = []
    shown: set[str] = set()
    for s in sorted(sources, key=lambda s: (-scores.get(s, -math.inf), -original_ts.get(s, 0.0))):
        sents = [x for x in split_sentences(original_text.get(s, "")) if x not in shown and x in text]
        if sents:
            parts.append((s, f"[{format_date(original_ts.get(s, timestamp))}]", sents))
            shown.update(sents)
    rest = [x for x in split_sentences(DATE_TAG.sub("\n", text)) if x not in shown]
    if rest or not parts:
        parts.append((None, parts[-1][1] if parts else f"[{format_date(timestamp)}]", rest))
    return parts


def join_parts(parts, sources: Sequence[str]) -> tuple[str, dict[str, int]]:
    """Parts (:func:`node_parts`) written one after the other, a date tag where the date changes:
    (rendered text, each of ``sources``' start; the end of the text for a source not shown)."""
    out: list[str] = []
    pos, last = -1, None  # the first part's tag is the header (no second tag)
    starts: dict[str, int] = {}
    for s, tag, sents in parts:
        if tag != last:
            out.append(tag)
            pos += 1 + len(tag)
            last = tag
        if s is not None:
            starts[s] = pos + 1
        for x in sents:
            out.append(x)
            pos += 1 + len(x)
    rendered = " ".join(out)
    return rendered, {s: starts.get(s, len(rendered)) for s in sources}


def matched_render(text: str, timestamp: float, sources: Sequence[str], scores: dict[str, float],
                   original_text: dict[str, str], original_ts: dict[str, float]) -> tuple[str, dict[str, int]]:
    """A merged node rendered for one question (module doc): (rendered text, each source's
    start)."""
    return join_parts(node_parts(text, timestamp, sources, scores, original_text, original_ts), sources)


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


def contexts(ranked: np.ndarray, store, views: NodeViews, max_tokens: int, *, fill: str = "plain",
             q_emb: torch.Tensor | None = None, questions: Sequence[str] = (), original_text=None,
             original_ts=None, split=None) -> list[list[tuple[int, View, int | None]]]:
    """Each question's ``@B`` context: (node, the view of what is shown of it, the character where
    it was cut or None when shown whole), in the order shown. ``fill`` (:data:`EVAL_FILLS`, module
    doc) other than ``"plain"`` needs ``q_emb`` (Q, D) (or ``questions``' texts, for a store without
    keys), ``original_text`` and ``original_ts`` (id -> text / timestamp of the originals).
    ``split(store, j)``: cut a merged node into parts from what the store holds
    (:func:`~.key_parts.key_split`) instead of the originals' texts; the originals then only say
    which evidence a shown piece holds (as the protocol's strict EvR@B does). ``fill="ranked"`` with
    :func:`~.key_parts.key_split` is the product's context
    (:func:`memforest_gpu.retrieval.context.ranked_pieces`), scored here."""
    if fill not in EVAL_FILLS:
        raise ValueError(f"fill must be one of {list(EVAL_FILLS)}, got {fill!r}")
    out = []
    memo: dict = {}
    for q, row in enumerate(ranked):
        qtok = frozenset(t for t in tokens(questions[q]) if t not in STOP_WORDS) if len(questions) else frozenset()
        nodes = [int(x) for x in row if x >= 0]

        def parts_of(j: int) -> list[tuple[str | None, View]]:
            v = stored_view(views, j)
            if fill == "plain" or len(v.sources) < 2:
                return [(v.sources[0] if len(v.sources) == 1 else None, v)]
            sc = source_scores(store, j, None if q_emb is None else q_emb[q], qtok, original_text)
            if split is not None:
                parts = sorted(split(store, j), key=lambda p: -sc.get(p[0], -math.inf))
            else:
                parts = node_parts(store.texts[j], float(store.timestamps[j]), v.sources, sc, original_text,
                                   original_ts)
            if fill == "matched" or (fill == "ranked" and (store.keys is None or store.keys.counts[j] == 0)):
                return [(None, _view(join_parts(parts, v.sources), v.sources, split, original_text))]
            return [(p[0], _view(join_parts([p], [p[0]] if p[0] else []), [p[0]] if p[0] else [], split,
                                 original_text, v.sources)) for p in parts]
        if fill in ("focused", "pooled"):  # the product's, the last pieces focused on the query: never cut here
            if getattr(split, "embed", None) is None:
                raise ValueError(f"fill={fill!r} needs split=key_split(embed) (the store's embedder)")
            pieces = fit_focused(ranked_pieces(store, nodes, q_emb[q], split.embed, memo=memo), max_tokens, q_emb[q],
                                 split.embed, store.timestamps, pool=POOL if fill == "pooled" else 1)
            out.append([(p.node, _piece_view(p, views, original_text), None) for p in pieces])
        elif fill == "ranked" and getattr(split, "embed", None) is not None:  # the product's context
            pieces = ranked_pieces(store, nodes, q_emb[q], split.embed, memo=memo)
            out.append(_cut(((p.node, _piece_view(p, views, original_text)) for p in pieces), max_tokens))
        elif fill == "ranked":
            scored = ([(x, (j, v)) for x, (_, v) in zip(_rule_scores(store, j, q_emb[q], [lb for lb, _ in ps]), ps)]
                      for j, ps in ((j, parts_of(j)) for j in nodes))
            out.append(_cut(in_rule_order(scored), max_tokens))
        else:
            out.append(_cut(_pieces(nodes, parts_of, max_tokens), max_tokens))
    return out


def _piece_view(p, views: NodeViews, original_text) -> View:
    """A product piece (:class:`~memforest_gpu.retrieval.context.Piece`) as a :class:`View`: a whole
    node's stored view, or a part's, whose sources are the node's whose text it holds verbatim."""
    if p.text == views.rendered[p.node]:
        return stored_view(views, p.node)
    return _view((p.text, {}), [], True, original_text, views.sources[p.node])


def _view(rendered_starts, sources, split, original_text, node_sources=None) -> View:
    """A piece's view: its sources as the parts say, or, when a ``split`` made the parts, the
    node's sources whose text the piece holds verbatim (:func:`~.metrics.source_starts`)."""
    rendered, starts = rendered_starts
    if split is None:
        return view_of(rendered, sources, starts)
    cand = list(node_sources or sources)
    found = source_starts(rendered, cand + ["\0"], original_text)  # never the one-source shortcut
    found = {s: p for s, p in found.items() if p < len(rendered) and s != "\0"}
    return view_of(rendered, list(found), found)


def _rule_scores(store, j: int, q_vec: torch.Tensor, sources: list) -> list[float]:
    """Each part's score by the store's rule with the key holding its source in place of the best
    key (:func:`~memforest_gpu.retrieval.context.part_scores`); the text's cosine for every part of
    a node without keys (and for the part of no source)."""
    t, by_key = part_scores(store, j, q_vec)
    by_src = {s: x for k, x in by_key.items() for s in store.keys.sources[k].as_py()}
    return [by_src.get(s, t) for s in sources]


def _pieces(nodes: list[int], parts_of, max_tokens: int):
    """(node, view) in the order shown: each node's first part in rank order, then each node's
    second part, and so on (one part per node under "plain" and "matched": rank order)."""
    memo: dict[int, list] = {}
    r, used = 0, 0
    while used < max_tokens:
        more = False
        for j in nodes:
            if j not in memo:
                memo[j] = parts_of(j)
            if r < len(memo[j]):
                more = True
                used += len(memo[j][r][1].ws_end)
                yield j, memo[j][r][1]
                if used >= max_tokens:
                    return
        if not more:
            return
        r += 1


def _cut(pieces, max_tokens: int) -> list[tuple[int, View, int | None]]:
    """The pieces that fit the max_tokens, the last one cut to fit (docs/evaluation.md's ``@B``;
    the product's :func:`~memforest_gpu.retrieval.context.fit`)."""
    return [(j, v, None if n is None else int(v.ws_end[n - 1]))
            for (j, v), n in fit(pieces, max_tokens, lambda p: len(p[1].ws_end))]


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
