"""Condensing a merge to the node cap: which sentences a merged memory keeps when it cannot
keep them all.

When a merged text would pass the node cap (``cap_policy="condense"`` of
:class:`~memforest_gpu.config.MergeConfig`, :meth:`~.extractive.ExtractiveMerger.condense`),
whole sentences are kept in priority order while they fit, then written in their order in
the merged text, the newest date first (with the tags of the segments that keep a sentence).
The priority (``salience``):

- ``"coverage"`` (the default): a greedy cover of what the pair says. Each step takes the
  sentence that brings the most content words (lowercase tokens, stop words out) not yet
  covered by the sentences taken, per word of its length; a word of a name, a number or a
  date counts twice; ties by text order (the newer date wins). So a sentence that repeats
  what is kept waits, and what each input says that the other does not comes first, wherever
  it sits in the text. Sentences that bring nothing new follow in the ``"centroid"`` order.
  Chosen on long memories of the dev file: docs/studies/long-memories.md.
- ``"centroid"``: (a) first the sentences carrying content a summary must not lose: a digit,
  a month or weekday name, or a capitalised word that is not the sentence's first (a name);
  (b) within each tier, the sentences closest to the pair's content: the cosine of the
  sentence's bag of words to the pair's centroid, the sum of each input's normalised bag of
  words (so both inputs weigh the same, whatever their lengths); ties by original order.

A sentence that does not fit is skipped and shorter ones after it may still fit. The text
is never empty: when even the first sentence alone passes the cap, its leading words
that fit are kept. No embedder is needed: the merger sees only texts.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

from ..store.timeutil import MONTHS
from .base import MergePair

__all__ = ["SALIENCES", "condense_one", "has_info"]

SALIENCES = ("coverage", "centroid")

_TOKEN = re.compile(r"[a-z0-9]+")
_STOP = frozenset(
    "a an the and or but if so of to in on at by for with from as is are was were be been being am do does did "
    "have has had i me my we our you your he him his she her it its they them their this that these those there "
    "here what which who whom how when where why all any some just very too also s t m re ve ll d oh yeah yes "
    "can could would should will shall may might must not no nor than then about into over out up down "
    "really hey hi wow".split())
_WEEKDAYS = frozenset("monday tuesday wednesday thursday friday saturday sunday".split())
_INFO_WORDS = frozenset(m.lower() for m in MONTHS) | _WEEKDAYS
_WORD = re.compile(r"[A-Za-z][\w'-]*")


def has_info(sentence: str) -> bool:
    """Whether a sentence carries a date, a number or a name (condensing's first tier): a
    digit, a month or weekday name, or a capitalised word other than its first word (a
    speaker's ``"Name:"`` counts as first) and "I"."""
    if any(ch.isdigit() for ch in sentence):
        return True
    words = _WORD.findall(sentence)
    if words and sentence.lstrip().startswith(words[0] + ":"):
        words = words[1:]  # "Caroline: ..." -> the speaker label is not the content's name
    for k, w in enumerate(words):
        if w.lower() in _INFO_WORDS:
            return True
        if k > 0 and w[0].isupper() and w not in ("I", "I'm", "I've", "I'll", "I'd"):
            return True
    return False


def _bag(text: str) -> Counter:
    return Counter(t for t in _TOKEN.findall(text.lower()) if t not in _STOP)


def _cosine(a: Counter, b: dict) -> float:
    dot = sum(v * b.get(t, 0.0) for t, v in a.items())
    na = math.sqrt(sum(v * v for v in a.values()))
    nb = math.sqrt(sum(v * v for v in b.values()))
    return dot / (na * nb) if na and nb else 0.0


def _centroid(pair: MergePair) -> dict:
    """The pair's centroid bag of words: each input's bag scaled to unit length, summed."""
    cen: dict = {}
    for item in (pair.older, pair.newer):
        bag = _bag(item.text)
        norm = math.sqrt(sum(v * v for v in bag.values())) or 1.0
        for t, v in bag.items():
            cen[t] = cen.get(t, 0.0) + v / norm
    return cen


def _coverage_order(sents: Sequence[str], rest: Sequence[int]) -> list[int]:
    """Sentences in the order a greedy cover of the pair's content picks them: each step the
    sentence bringing the most content not yet covered per word (a word of a name, number or
    date counts twice), ties by original order; those that bring nothing new follow in
    ``rest``'s order."""
    toks = [frozenset(t for t in _TOKEN.findall(s.lower()) if t not in _STOP) for s in sents]
    weight: dict[str, float] = {}
    for s in sents:
        for w in _WORD.findall(s)[1:]:
            if w[0].isupper() or w.lower() in _INFO_WORDS:
                weight[w.lower()] = 2.0
        for t in _TOKEN.findall(s.lower()):
            if t[0].isdigit():
                weight[t] = 2.0
    cost = [max(1, len(s.split())) for s in sents]
    covered: set[str] = set()
    left, order = set(range(len(sents))), []
    while left:
        gain = {k: sum(weight.get(t, 1.0) for t in toks[k] - covered) / cost[k] for k in left}
        best = min(left, key=lambda k: (-gain[k], k))
        if gain[best] <= 0:
            break
        order.append(best)
        covered |= toks[best]
        left.discard(best)
    return order + [k for k in rest if k in left]


def condense_one(labels, groups, tagged, pair, cap, counter, sent_cost, tag_cost, write, raw: str,
                 salience: str = "coverage") -> str:
    """The merge of ``pair`` (its date ``labels`` and deduplicated sentence ``groups``, ``tagged``
    when dates are written) cut to ``cap`` tokens (module docstring). ``counter`` counts a list of
    texts' tokens; ``sent_cost`` / ``tag_cost`` hold each sentence's and tag's count; ``write``
    writes labels and groups as a text; ``raw``: the text when the pair has no sentence."""
    cen = _centroid(pair)
    flat = [(g, i, s) for g, sents in enumerate(groups) for i, s in enumerate(sents)]
    prio = sorted(range(len(flat)), key=lambda k: (not has_info(flat[k][2]), -_cosine(_bag(flat[k][2]), cen), k))
    if salience == "coverage":
        prio = _coverage_order([s for _, _, s in flat], prio)
    order = prio
    while order:
        keep, used, opened = set(), 0, set()
        for k in order:
            g = flat[k][0]
            cost = sent_cost[flat[k][2]] + (tag_cost[f"[{labels[g]}]"] if tagged and g not in opened else 0)
            if used + cost <= cap:
                keep.add(k)
                used += cost
                opened.add(g)
        if not keep:
            break
        kept = [[s for k, (g2, _, s) in enumerate(flat) if k in keep and g2 == g] for g in range(len(groups))]
        text = write(labels, kept, tagged)
        if counter([text])[0] <= cap:
            return text
        order = [k for k in order if k in keep][:-1]  # the sum of parts was short: drop the last kept
    if not flat:
        return raw
    # not even the first sentence fits alone: the longest prefix of its words that does (one word at least)
    g, _, s = flat[prio[0]]
    prefix = f"[{labels[g]}] " if tagged else ""
    words = s.split()
    lo, hi = 1, len(words)  # the longest prefix of words within the cap (at least one word)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if counter([prefix + " ".join(words[:mid])])[0] <= cap:
            lo = mid
        else:
            hi = mid - 1
    return prefix + " ".join(words[:lo])
