"""The extractive merger of memforest_gpu/mergers/extractive.py as it was before the per-merge
work was cut (main at 534664a), kept verbatim (only its imports made absolute) as the reference
the tests compare with: every text the merger writes must equal this one's, byte for byte.
One rule changed since, here as in the merger: segments are written the newest date first (rule 4).

Its own docstring follows.

An extractive merger: the union of two memories' sentences, minus duplicates.

No model, no network, deterministic. A merged memory carries one timestamp, so the
dates live in the text: segments of different days are written with a date tag such
as ``[8 May 2023]`` (the format of :func:`memforest_gpu.store.timeutil.format_date`), and
tags written by an earlier merge are read back, so merging a merge keeps every date.

Rules, in order:

1. Each input is cut into segments at date tags ``[<day> <Month> <year>]`` (a tag
   counts at the start of the text or after whitespace); text before the first tag
   gets that input's own date. Each segment is split into sentences.
2. Segments are sorted by date (stable: older input first on ties) and adjacent
   segments of one date are coalesced.
3. Sentences are kept in that order; one is dropped when its normalised tokens
   (lowercase alphanumeric runs) equal a kept sentence's, or have Jaccard
   >= ``near_duplicate`` with one (only if it brings no number the kept one lacks), or
   (3+ tokens) are all contained in one kept sentence. A sentence whose negations
   (not, no, never, n't ...) differ from the kept one's is never dropped as a near
   duplicate.
4. If every segment of both inputs has the same date, no tags are written; otherwise
   every segment is written with its tag, the newest date first. Segments left empty by step 3 vanish.

Condensing (:meth:`ExtractiveMerger.condense`, the ``cap_policy="condense"`` of
:class:`~memforest_gpu.config.MergeConfig`): when the merged text would pass the node
cap, whole sentences are kept in priority order while they fit, then written in their
original order (with the tags of the segments that keep a sentence):

a. first the sentences carrying content a summary must not lose: a digit, a month or
   weekday name, or a capitalised word that is not the sentence's first (a name);
b. within each tier, the sentences closest to the pair's content: the cosine of the
   sentence's bag of words (lowercase tokens, stop words out) to the pair's centroid,
   the sum of each input's normalised bag of words (so both inputs weigh the same,
   whatever their lengths); ties by original order.

A sentence that does not fit is skipped and shorter ones after it may still fit. The text
is never empty: when even the first sentence alone passes the cap, its leading words
that fit are kept. No embedder is needed: the merger sees only texts.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import date
from functools import lru_cache

from memforest_gpu.config import ConfigError
from memforest_gpu.mergers.base import MergePair
from memforest_gpu.mergers.parallel import map_parts, spare_cores
from memforest_gpu.store.timeutil import DATE_TAG, MONTHS, format_date

__all__ = ["ExtractiveMerger", "split_sentences", "normalize", "dedup_sentences", "has_info"]

_MONTH_NO = {m: i + 1 for i, m in enumerate(MONTHS)}
_TOKEN = re.compile(r"[a-z0-9]+")
_END = re.compile(r"[.!?]+[\"'\u201d\u2019)\]]*(?=\s)")
_ABBREV = frozenset(
    "mr mrs ms dr prof sr jr st vs etc e.g i.e cf approx fig vol dept est inc ltd co mt ft "
    "gen col lt sgt capt rev hon a.m p.m u.s u.k "
    "jan feb mar apr jun jul aug sep sept oct nov dec".split())
_NEGATIONS = frozenset("not no never t nor neither none nobody nothing cannot without".split())
_STOP = frozenset(
    "a an the and or but if so of to in on at by for with from as is are was were be been being am do does did "
    "have has had i me my we our you your he him his she her it its they them their this that these those there "
    "here what which who whom how when where why all any some just very too also s t m re ve ll d oh yeah yes "
    "can could would should will shall may might must not no nor than then about into over out up down "
    "really hey hi wow".split())
_WEEKDAYS = frozenset("monday tuesday wednesday thursday friday saturday sunday".split())
_INFO_WORDS = frozenset(m.lower() for m in MONTHS) | _WEEKDAYS
_WORD = re.compile(r"[A-Za-z][\w'-]*")


def normalize(sentence: str) -> tuple[str, ...]:
    """Lowercase alphanumeric token runs: ``"Mr. Smith's 2 dogs!" -> ('mr', 'smith', 's', '2',
    'dogs')``."""
    return tuple(_TOKEN.findall(sentence.lower()))


def _no_split(text: str, m: re.Match) -> bool:
    """True when the punctuation at ``m`` ends an abbreviation, an initial or a date,
    or closes a quote that the sentence goes on after (``"Really?" she asked.``)."""
    after = text[m.end():].lstrip()
    nxt = after.split(None, 1)[0] if after else ""
    if m.group()[-1] in "\"'\u201d\u2019" and nxt[:1].islower():
        return True
    if m.group().rstrip("\"'\u201d\u2019)]") != ".":
        return False
    word = text[:m.start()].rsplit(None, 1)[-1] if text[:m.start()].strip() else ""
    word = word.lstrip("\"'\u201c\u2018([")
    low = word.lower()
    if low in _ABBREV or re.fullmatch(r"[A-Z]", word):
        return True
    if low == "no" and nxt[:1].isdigit():  # "No. 5"
        return True
    return word.isdigit() and nxt.rstrip(",.") in _MONTH_NO  # "8. May 2023"


def split_sentences(text: str) -> list[str]:
    """Split on newlines and on ``. ! ?`` (plus closing quotes/brackets) before
    whitespace, except after abbreviations ("Dr.", "e.g."), initials, "8. May" and a
    closing quote the sentence goes on after (``"Hi!" she said.``).
    Decimals ("3.5") never split since no whitespace follows the dot."""
    out: list[str] = []
    for line in text.splitlines():
        start = 0
        for m in _END.finditer(line):
            if not _no_split(line, m):
                out.append(line[start:m.end()].strip())
                start = m.end()
        out.append(line[start:].strip())
    return [s for s in out if s]


def _numbers(tokens: tuple[str, ...]) -> tuple[str, ...]:
    """The tokens that contain a digit, in order (tokens are ``[a-z0-9]+``: the ones that are
    not all letters)."""
    return tuple(t for t in tokens if not t.isalpha())


def _in_order(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """``a`` is a subsequence of ``b`` ("paid 10 on day 3" is not a duplicate of "paid 3 on day
    10")."""
    if not a or a == b:
        return True
    it = iter(b)
    return all(x in it for x in a)  # `in` consumes the iterator up to the match


def _repeats(tokens, a: frozenset | set, a_nums: tuple, b: frozenset | set, b_nums: tuple,
             threshold: float) -> bool:
    if not a or (a & _NEGATIONS) != (b & _NEGATIONS):
        return False
    if not _in_order(a_nums, b_nums):
        return False
    if len(tokens) >= 3 and a <= b:
        return True
    if not b.issuperset(a_nums):  # a new number is new information
        return False
    return len(a & b) / len(a | b) >= threshold


def _could_repeat(n_tokens: int, la: int, lb: int, threshold: float) -> bool:
    """Whether a sentence of set size ``la`` can be a near duplicate of a kept one of set size
    ``lb`` at all: containment needs la <= lb, Jaccard >= threshold needs min/max >= threshold
    (the Jaccard index never exceeds min/max, and rounding keeps that order)."""
    return (n_tokens >= 3 and la <= lb) or min(la, lb) / max(la, lb) >= threshold


@lru_cache(maxsize=1 << 16)
def _sentence_info(sent: str) -> tuple[tuple[str, ...], frozenset, tuple[str, ...], frozenset]:
    """(tokens, token set, numbers, negations) of a sentence; cached, since progressive
    merging sees the same sentences again in every later merge of their node."""
    toks = normalize(sent)
    a = frozenset(toks)
    return toks, a, _numbers(toks), a & _NEGATIONS


def dedup_sentences(groups: Sequence[Sequence[str]], threshold: float = 0.9) -> list[list[str]]:
    """Drop exact and near duplicates across ``groups`` (kept in order, first wins);
    returns the groups with the same shape, possibly emptied."""
    seen: set = set()
    kept: list[tuple[frozenset, tuple, frozenset]] = []  # (token set, numbers, negations) of kept sentences
    out: list[list[str]] = []
    for group in groups:
        cur: list[str] = []
        for sent in group:
            toks, a, nums, neg = _sentence_info(sent)
            key = toks or sent  # token-less text ("...", emoji) dedups verbatim
            if key in seen:
                continue
            if toks and any(kneg == neg and _could_repeat(len(toks), len(a), len(b), threshold)
                            and _repeats(toks, a, nums, b, b_nums, threshold) for b, b_nums, kneg in kept):
                continue
            seen.add(key)
            kept.append((a, nums, neg))
            cur.append(sent)
        out.append(cur)
    return out


def _segments(text: str, ts: float) -> list[tuple[date, str, list[str]]]:
    """``[(day, 'D Month YYYY', sentences), ...]`` for one input, in text order."""
    d0 = format_date(ts)
    day, month, year = d0.split()
    segs = [(date(int(year), _MONTH_NO[month], int(day)), d0, text)]
    pos = 0
    for m in DATE_TAG.finditer(text):
        try:
            key = date(int(m.group(3)), _MONTH_NO[m.group(2)], int(m.group(1)))
        except ValueError:  # "[31 February 2023]" is text, not a tag
            continue
        segs[-1] = (*segs[-1][:2], text[pos:m.start()])
        segs.append((key, f"{key.day} {m.group(2)} {key.year}", text[m.end():]))
        pos = m.end()
    segs[-1] = (*segs[-1][:2], text[pos:])
    return [(k, s, split_sentences(t)) for k, s, t in segs]


class ExtractiveMerger:
    """Merge two memories by keeping each distinct sentence once, with date tags.

    Example::

        >>> from memforest_gpu.mergers.base import MemoryItem, MergePair
        >>> a = MemoryItem("a", "Caroline: I joined a support group.", 1683554160.0)  # 8 May 2023
        >>> b = MemoryItem("b", "Melanie: I painted a lake.", 1683640560.0)  # 9 May 2023
        >>> ExtractiveMerger().merge([MergePair(a, b)])
        ['[8 May 2023] Caroline: I joined a support group. [9 May 2023] Melanie: I painted a lake.']

    ``near_duplicate`` is the token-set Jaccard at or above which a sentence counts as a
    repeat of a kept one (1.0: only the same token set in another order). ``processes``:
    worker processes that merge parts of a batch of at least ``parallel_above`` pairs beside
    this one (:func:`~.parallel.map_parts`; default one per spare core; 0: none). The texts
    are the same whatever the split.
    """

    name = "extractive"

    def __init__(self, *, near_duplicate: float = 0.9, processes: int | None = None,
                 parallel_above: int = 4096) -> None:
        value = near_duplicate
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise ConfigError("near_duplicate", f"must be in (0, 1], got {value!r}")
        if processes is not None and (isinstance(processes, bool) or not isinstance(processes, int) or processes < 0):
            raise ConfigError("processes", f"must be an integer >= 0 or None, got {processes!r}")
        self.near_duplicate = float(value)
        self.processes = spare_cores() if processes is None else processes
        self.parallel_above = parallel_above

    def __repr__(self) -> str:
        return f"ExtractiveMerger(near_duplicate={self.near_duplicate})"

    def merge(self, pairs: Sequence[MergePair]) -> list[str]:
        """One merged, non-empty text per pair, in the order of ``pairs``."""
        return map_parts(_merge_part, self.near_duplicate, pairs, workers=self.processes,
                         min_items=self.parallel_above)

    def condense(self, pairs: Sequence[MergePair], cap: int,
                 counter: Callable[[Sequence[str]], list[int]]) -> tuple[list[str], list[int]]:
        """One merged, non-empty text per pair whose ``counter`` length is at most ``cap``
        (see "Condensing" in the module docstring), and the tokens each one dropped (the
        full merge's count minus the text's; 0 for a merge that fits: :meth:`merge`'s text).
        ``counter`` counts tokens of a list of texts (the embedder's tokenizer)."""
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise ConfigError("cap", f"must be an integer >= 1, got {cap!r}")
        pairs = list(pairs)
        out = self.merge(pairs)
        full = counter(out)
        over = [j for j, c in enumerate(full) if c > cap]
        dropped = [0] * len(pairs)
        if not over:
            return out, dropped
        plans = [self._merged(pairs[j]) for j in over]
        sents = [s for labels, groups, _ in plans for g in groups for s in g]
        tags = [f"[{lab}]" for labels, _, tagged in plans if tagged for lab in labels]
        costs = iter(counter(sents + tags))
        sent_cost = {s: c for s, c in zip(sents, costs)}
        tag_cost = dict(zip(tags, costs))
        for j, (labels, groups, tagged) in zip(over, plans):
            out[j] = _condense_one(labels, groups, tagged, pairs[j], cap, counter, sent_cost, tag_cost)
        for j, c in zip(over, counter([out[j] for j in over])):
            dropped[j] = full[j] - c
        return out, dropped

    def _merged(self, pair: MergePair) -> tuple[list[str], list[list[str]], bool]:
        """(date labels, their deduplicated sentences, whether tags are written) of a pair."""
        return _merged(pair, self.near_duplicate)


def _merge_part(near_duplicate: float, pairs: Sequence[MergePair]) -> list[str]:
    """The merged texts of ``pairs`` (what :meth:`ExtractiveMerger.merge` maps over parts)."""
    return [_merge_one(p, near_duplicate) for p in pairs]


def _merged(pair: MergePair, near_duplicate: float) -> tuple[list[str], list[list[str]], bool]:
    """(date labels, their deduplicated sentences, whether tags are written) of a pair."""
    segs = [s for item in (pair.older, pair.newer)
            for s in _segments(item.text, item.timestamp) if s[2]]
    segs.sort(key=lambda s: s[0])  # stable: older input first on equal dates
    merged: list[tuple[str, list[str]]] = []
    for _, label, sents in segs:
        if merged and merged[-1][0] == label:
            merged[-1][1].extend(sents)
        else:
            merged.append((label, list(sents)))
    groups = dedup_sentences([s for _, s in merged], near_duplicate)
    return [lab for lab, _ in merged][::-1], groups[::-1], len(merged) > 1  # the newest date first


def _merge_one(pair: MergePair, near_duplicate: float) -> str:
    labels, groups, tagged = _merged(pair, near_duplicate)
    out = _write(labels, groups, tagged)
    if out:
        return out
    return _raw(pair)


def _write(labels: Sequence[str], groups: Sequence[Sequence[str]], tagged: bool) -> str:
    return " ".join((f"[{label}] " if tagged else "") + " ".join(g) for label, g in zip(labels, groups) if g)


def _raw(pair: MergePair) -> str:
    """Nothing but tags/whitespace in both inputs: keep the raw text, never ""."""
    raw = " ".join(t for t in (pair.older.text.strip(), pair.newer.text.strip()) if t)
    return raw or f"[{format_date(pair.older.timestamp)}]"


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


def _condense_one(labels, groups, tagged, pair, cap, counter, sent_cost, tag_cost) -> str:
    """The merge of ``pair`` cut to ``cap`` tokens (module docstring, "Condensing")."""
    cen = _centroid(pair)
    flat = [(g, i, s) for g, sents in enumerate(groups) for i, s in enumerate(sents)]
    prio = sorted(range(len(flat)), key=lambda k: (not has_info(flat[k][2]), -_cosine(_bag(flat[k][2]), cen), k))
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
        text = _write(labels, kept, tagged)
        if counter([text])[0] <= cap:
            return text
        order = [k for k in order if k in keep][:-1]  # the sum of parts was short: drop the last kept
    if not flat:
        return _raw(pair)
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
