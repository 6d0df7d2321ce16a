"""The context a search gives: a token budget filled with the parts of merged nodes that matched.

A merged node's text is its sources' sentences by date (newest first), so a merged node found
through one of its sources' keys can spend the whole budget on the sources before it, the one that
matched cut off. ``fill="ranked"`` (docs/long-memories.md) cuts every merged node that has keys into
**parts**, one per key: each sentence of the merged text (with the date tag of its segment) is
embedded by the store's embedder and given to the key it is closest to; a part is a key's sentences
in text order, shown ``"[date] sentence sentence ..."`` with the date of its first sentence's
segment. Nothing but the store and its embedder is read. The parts of the hits are then shown in the
order of the store's own rule with each part's own key in place of the node's best key,
``w cos(q, text) + (1 - w) cos(q, key)`` (:mod:`memforest_gpu.store.keys`): a node's second
source comes before another node's first when its key matches the question better, and the part
that matched comes first even when the node's text begins with other sources. An original, a node
without keys, and every node of a store without keys is one piece, its whole text ``"[date] text"``
(:func:`dated`; ``fill="plain"``: every hit so, in rank order, as the evaluation's ``@B`` cut).

Pieces are shown until ``max_tokens`` whitespace tokens are used (the token count of the
evaluation's ``@B`` cut, docs/evaluation.md); only the last piece is cut, to its first tokens
that fit.
``fill="focused"`` shows that last piece by its sentences that match the query best instead
(:func:`focus`), and ``fill="pooled"`` (**the default for a store with merged nodes**, given its
embedder) lets it and the
:data:`POOL` - 1 pieces after it share what is left, sentence by sentence (:func:`focus_many`): a
session or a long merged node longer than the budget is no longer cut to its first tokens. AGPR's
hits are read in AGPR's order by the same rule (a part waits only for a later node that could beat
it), which keeps more answers on the dev file than AGPR's order of whole nodes
(docs/long-memories.md).

>>> res = Retriever(store).search(q_emb, tenants="alice", config=RetrievalConfig(k=40))
>>> ctx = context(store, res, q_emb, max_tokens=256, embedder=embedder)   # per query: [Piece, ...]
"""
from __future__ import annotations

import heapq
import itertools
import numbers
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass

import pyarrow.compute as pc
import torch

from ..config import FILLS, MIN_CONTEXT_TOKENS
from ..renamed import renamed_keyword
from ..sentences import split_sentences
from ..store.timeutil import DATE_TAG, format_date

__all__ = ["FILLS", "MIN_CONTEXT_TOKENS", "Piece", "context", "whole_tags", "dated", "dated_sentences", "key_parts",
           "part_scores", "in_rule_order", "ranked_pieces", "fit", "focus", "focus_many", "fit_focused", "default_fill",
           "check_fill", "has_keys", "has_merged"]

POOL = 4  # fill="pooled": the first piece that does not fit and the 3 after it share what is left
_WS = re.compile(r"\S+")


@dataclass(frozen=True)
class Piece:
    """What the context shows of one node: ``node`` (store row), ``id`` (the node's id),
    ``sources`` (the original ids the piece stands for: its key's, or the node's when whole),
    ``text`` (as shown, with its date tag; cut when ``cut``), ``score`` (under ``"ranked"``: the
    store's rule with the piece's key, a whole node's similarity; under ``"plain"``: the hit's
    score, AGPR's under AGPR)."""

    node: int
    id: str
    sources: list[str]
    text: str
    score: float
    cut: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


def has_keys(store) -> bool:
    """Whether any node of ``store`` has keys (only then does ``"ranked"`` cut nodes into parts)."""
    return store.keys is not None and len(store.keys.vectors) > 0


def default_fill(store) -> str:
    """``"pooled"`` for a store with merged nodes or keys (chosen over whole nodes on the dev file:
    docs/studies/one-vector-per-node.md, docs/studies/long-memories.md; it needs the embedder of the
    store's vectors, which matches a long piece's sentences to the query), ``"plain"`` (whole
    nodes, no embedder needed) for a store of originals only."""
    return "pooled" if has_keys(store) or has_merged(store) else "plain"


def has_merged(store) -> bool:
    """Whether any node of ``store`` stands for more than one original."""
    lengths = pc.list_value_length(store.columns()["sources"])
    return bool(len(store)) and (pc.max(lengths).as_py() or 0) > 1


def check_fill(fill: str, max_tokens, store, embedder) -> None:
    """Refuse an unknown fill, a ``max_tokens`` that is not an integer >= 1, and ``"ranked"`` on a
    store with keys without the embedder that gives its sentences to keys."""
    if fill not in FILLS:
        raise ValueError(f"fill must be one of {list(FILLS)}, got {fill!r}")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, numbers.Integral) or max_tokens < 1:
        raise ValueError(f"max_tokens must be an integer >= 1 (whitespace tokens), got {max_tokens!r}")
    if fill == "ranked" and embedder is None and has_keys(store):
        raise ValueError("fill='ranked' on a store with keys needs the embedder of the store's vectors (it gives "
                         "each sentence of a merged node to its key): pass embedder=, or fill='plain'")
    if fill in ("focused", "pooled") and embedder is None:
        raise ValueError(f"fill={fill!r} needs the embedder of the store's vectors (it matches the sentences of "
                         "a piece longer than the budget left to the query): pass embedder=, or fill='ranked'")


def dated(text: str, timestamp: float) -> str:
    """A whole node as shown: ``"[date] text"``, or its text as it is when it begins with a date tag
    (a merged text tags every date itself, the newest first: a second tag would repeat it)."""
    return text if DATE_TAG.match(text) else f"[{format_date(timestamp)}] {text}"


def dated_sentences(text: str, timestamp: float) -> list[tuple[str, str]]:
    """(date tag, sentence) of a merged text, in order; text before any tag gets the node's date."""
    out, tag, pos = [], f"[{format_date(timestamp)}]", 0
    for m in DATE_TAG.finditer(text):
        out += [(tag, x) for x in split_sentences(text[pos:m.start()])]
        tag, pos = m.group(), m.end()
    return out + [(tag, x) for x in split_sentences(text[pos:])]


def key_parts(store, j: int, embed: Callable) -> list[tuple[int | None, str, list[str]]]:
    """Node ``j``'s parts (module doc) in text order: (key row in ``store.keys``, date tag,
    sentences), each sentence given to its closest key; ``[(None, tag, every sentence)]`` for a
    node without keys. ``embed(texts) -> (n, D)`` unit rows: the store's embedder."""
    sents = dated_sentences(store.texts[j], float(store.timestamps[j]))
    keys = store.keys
    if not sents or keys is None or keys.counts[j] == 0:
        return [(None, sents[0][0] if sents else f"[{format_date(float(store.timestamps[j]))}]",
                 [x for _, x in sents])]
    lo, hi = int(keys.offsets[j]), int(keys.offsets[j + 1])
    K = keys.unit(torch.arange(lo, hi))  # (m, D)
    V = torch.as_tensor(embed([x for _, x in sents])).float().cpu()  # (n, D)
    best = (V @ K.cpu().T).argmax(1).tolist()
    parts: dict[int, tuple[str, list[str]]] = {}
    for (tag, x), k in zip(sents, best):
        parts.setdefault(lo + k, (tag, []))[1].append(x)
    return [(k, tag, xs) for k, (tag, xs) in parts.items()]


def part_scores(store, j: int, q_vec: torch.Tensor) -> tuple[float, dict[int, float]]:
    """Node ``j``'s text cosine ``t`` and, per key row ``k``, the store's rule with that key alone:
    ``w t + (1 - w) cos(q, key_k)`` (empty for a node without keys)."""
    q = torch.nn.functional.normalize(q_vec.detach().float().cpu(), dim=0)
    t = float(torch.nn.functional.normalize(store.embeddings[j].float().cpu(), dim=0) @ q)
    keys = store.keys
    if keys is None or keys.counts[j] == 0:
        return t, {}
    lo, hi = int(keys.offsets[j]), int(keys.offsets[j + 1])
    w = float(keys.text_weight)
    cos = (keys.unit(torch.arange(lo, hi)).cpu() @ q).tolist()
    return t, {lo + i: w * t + (1 - w) * c for i, c in enumerate(cos)}


def in_rule_order(nodes_parts: Iterable[list[tuple[float, object]]]) -> Iterator:
    """The items of each ranked node's (score, item) parts, highest score first (ties: node rank,
    then the part's place). A part never scores above its node, whose score falls with the rank
    under top-k, so a part is yielded as soon as no later node can beat it (nodes are read lazily;
    a later node that scores higher, as AGPR may rank one, is sorted in among the waiting parts)."""
    heap: list = []
    for r, parts in enumerate(nodes_parts):
        top = max(s for s, _ in parts)
        while heap and -heap[0][0] >= top:
            yield heapq.heappop(heap)[3]
        for i, (s, item) in enumerate(parts):
            heapq.heappush(heap, (-s, r, i, item))
    while heap:
        yield heapq.heappop(heap)[3]


def ranked_pieces(store, nodes: Sequence[int], q_vec: torch.Tensor, embed: Callable | None, *,
                  memo: dict | None = None) -> Iterator[Piece]:
    """The whole pieces of the ranked ``nodes`` (store rows) in the order shown (module doc; a store
    without keys: its hits whole, in their order). ``memo``: node -> its parts, kept between queries
    (the parts do not depend on the query)."""
    memo = {} if memo is None else memo
    ts = store.timestamps

    def scored(j: int) -> list[tuple[float, Piece]]:
        t, by_key = part_scores(store, j, q_vec)
        srcs = list(store.sources[j])
        if not by_key or len(srcs) < 2:  # one piece: the whole node, scored as the node
            whole = dated(store.texts[j], float(ts[j]))
            s = max(by_key.values()) if by_key else t
            return [(s, Piece(j, store.ids[j], srcs, whole, s))]
        if j not in memo:
            memo[j] = key_parts(store, j, embed)
        out = []
        for k, tag, sents in memo[j]:
            s = by_key.get(k, t)
            out.append((s, Piece(j, store.ids[j], store.keys.sources[k].as_py() if k is not None else srcs,
                                 " ".join([tag, *sents]), s)))
        return sorted(out, key=lambda p: -p[0])  # stable: text order on ties

    if not has_keys(store):  # whole nodes in the hits' order (AGPR's too), as fill="plain"
        yield from (scored(j)[0][1] for j in nodes)
        return
    yield from in_rule_order(scored(j) for j in nodes)


def whole_tags(pieces: list[Piece]) -> list[Piece]:
    """``pieces`` without a last piece cut inside its date tag or right after it: what search
    shows of a piece is its date and at least one word of its text (the evaluation's ``@B`` cut,
    :func:`fit`, counts the tokens as they fall)."""
    if pieces and pieces[-1].cut:
        m = DATE_TAG.match(pieces[-1].text)
        if m is None and pieces[-1].text.startswith("[") or m is not None and not pieces[-1].text[m.end():].strip():
            return pieces[:-1]
    return pieces


def fit(items: Iterable, max_tokens: int, n_tokens: Callable) -> list[tuple[object, int | None]]:
    """The items that fit ``max_tokens`` tokens, in order: (item, None) shown whole, the last one
    (item, its first n tokens) when it had to be cut."""
    used, out = 0, []
    for item in items:
        if used >= max_tokens:
            break
        n = n_tokens(item)
        if used + n <= max_tokens:
            out.append((item, None))
            used += n
            continue
        out.append((item, max_tokens - used))
        break
    return out


def _n_tokens(text: str) -> int:
    return len(_WS.findall(text))


def focus(piece: Piece, left: int, q_vec: torch.Tensor, embed: Callable, timestamp: float) -> Piece:
    """``piece`` shown in ``left`` whitespace tokens by its sentences that match the query best
    (``fill="focused"``, docs/long-memories.md): its sentences (each with its segment's date tag)
    are taken by their cosine to the query, best first, each one that still fits (a sentence too
    long for what is left is skipped, shorter ones after it may fit), and written in text order
    with a date tag where the date changes; when not even the best sentence fits, its first tokens
    that fit. ``cut=True``: the piece is a selection of its text."""
    return focus_many([piece], left, q_vec, embed, [timestamp])[0]


def focus_many(pieces: Sequence[Piece], left: int, q_vec: torch.Tensor, embed: Callable,
               timestamps: Sequence[float]) -> list[Piece]:
    """:func:`focus` over several pieces at once (``fill="pooled"``): their sentences compete for
    ``left`` tokens by their cosine to the query (ties: the piece's place, then the sentence's);
    each piece that keeps a sentence is shown, in the pieces' order, by its kept sentences."""
    sents = [(k, tag, x) for k, (p, ts) in enumerate(zip(pieces, timestamps)) for tag, x in dated_sentences(p.text, ts)]
    if not sents:
        p = pieces[0]
        return [Piece(p.node, p.id, p.sources, _cut_text(p.text, left), p.score, True)]
    q = torch.nn.functional.normalize(torch.as_tensor(q_vec).detach().float().cpu(), dim=0)
    cos = (torch.as_tensor(embed([x for _, _, x in sents])).float().cpu() @ q).tolist()
    chosen: set[int] = set()
    opened: set[tuple[int, str]] = set()
    used = 0
    for i in sorted(range(len(sents)), key=lambda i: (-cos[i], i)):
        k, tag, x = sents[i]
        c = _n_tokens(x) + (0 if (k, tag) in opened else _n_tokens(tag))
        if used + c <= left:
            chosen.add(i)
            opened.add((k, tag))
            used += c
    if not chosen:  # not even the best sentence fits: its first tokens
        best = max(range(len(sents)), key=lambda i: (cos[i], -i))
        p = pieces[sents[best][0]]
        return [Piece(p.node, p.id, p.sources, _cut_text(" ".join(sents[best][1:]), left), p.score, True)]
    out = []
    for k, p in enumerate(pieces):
        words, last = [], None
        for i in sorted(i for i in chosen if sents[i][0] == k):
            if sents[i][1] != last:
                words.append(sents[i][1])
                last = sents[i][1]
            words.append(sents[i][2])
        if words:
            out.append(Piece(p.node, p.id, p.sources, " ".join(words), p.score, True))
    return out


def fit_focused(pieces: Iterable[Piece], max_tokens: int, q_vec: torch.Tensor, embed: Callable, timestamps, *,
                pool: int = 1) -> list[Piece]:
    """The pieces that fit ``max_tokens`` tokens, in order; the first one longer than what is left
    is :func:`focus`-ed on the query instead of cut to its first tokens (``pool`` > 1: it and the
    ``pool - 1`` pieces after it, :func:`focus_many`)."""
    out, used = [], 0
    it = iter(pieces)
    for p in it:
        if used >= max_tokens:
            break
        n = _n_tokens(p.text)
        if used + n <= max_tokens:
            out.append(p)
            used += n
            continue
        group = [p, *itertools.islice(it, pool - 1)]
        shown = focus_many(group, max_tokens - used, q_vec, embed, [float(timestamps[g.node]) for g in group])
        out += shown
        break
    return out


def _memo_embed(embed: Callable, memo: dict) -> Callable:
    """``embed`` that embeds each distinct text once (the queries of one call share sentences)."""
    def cached(texts):
        texts = list(texts)
        new = [t for t in dict.fromkeys(texts) if t not in memo]
        if new:
            memo.update(zip(new, torch.as_tensor(embed(new)).float().cpu()))
        return torch.stack([memo[t] for t in texts]) if texts else torch.zeros(0)
    return cached


def _cut_text(text: str, n: int) -> str:
    """``text``'s first ``n`` whitespace tokens, as written (inner spacing kept)."""
    ends = [m.end() for m in _WS.finditer(text)]
    return text if n >= len(ends) else text[:ends[n - 1]]


def context(store, result, queries: torch.Tensor, *, max_tokens: int | None = None, fill: str | None = None,
            embedder=None, **renamed) -> list[list[Piece]]:
    """Per query, the pieces shown in ``max_tokens`` whitespace tokens (module doc), from a
    :class:`~.retriever.SearchResult` of ``store`` and the (Q, D) query vectors that made it.
    ``fill``: :data:`FILLS` (None: :func:`default_fill`); ``embedder`` (the model of the store's
    vectors) is needed for ``"ranked"`` on a store with keys, and always for ``"focused"`` and
    ``"pooled"`` (``budget=``: the old name of ``max_tokens``)."""
    max_tokens = renamed_keyword("context", renamed, "budget", "max_tokens", max_tokens)
    fill = default_fill(store) if fill is None else fill
    check_fill(fill, max_tokens, store, embedder)
    idx = result.index.cpu().tolist()
    sc = result.score.cpu().tolist()
    q_all = torch.as_tensor(queries).float().cpu()
    if q_all.ndim != 2 or q_all.shape[0] != len(idx):
        raise ValueError(f"queries must be the ({len(idx)}, D) vectors the result was searched with, "
                         f"got shape {tuple(q_all.shape)}")
    memo: dict = {}
    embed = None if embedder is None else _memo_embed(embedder.embed, {})
    out = []
    for q, row in enumerate(idx):
        nodes = [j for j in row if j >= 0]
        if fill == "plain" or not has_keys(store):
            pieces: Iterable[Piece] = (Piece(j, store.ids[j], list(store.sources[j]),
                                             dated(store.texts[j], float(store.timestamps[j])), s)
                                       for j, s in zip(row, sc[q]) if j >= 0)
        else:
            pieces = ranked_pieces(store, nodes, q_all[q], embed, memo=memo)
        if fill in ("focused", "pooled"):
            out.append(fit_focused(pieces, max_tokens, q_all[q], embed, store.timestamps,
                                   pool=POOL if fill == "pooled" else 1))
            continue
        out.append([p if n is None else Piece(p.node, p.id, p.sources, _cut_text(p.text, n), p.score, True)
                    for p, n in fit(pieces, max_tokens, lambda p: _n_tokens(p.text))])
    return out
