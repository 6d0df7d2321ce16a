"""An extractive merger: the union of two memories' sentences, minus duplicates.

No model, no network, deterministic. A merged memory carries one timestamp, so the
dates live in the text: segments of different days are written with a date tag such
as ``[8 May 2023]`` (the format of :func:`memforest_gpu.timeutil.format_date`), and
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
   every segment is written with its tag. Segments left empty by step 3 vanish.
"""
from __future__ import annotations

import re
from datetime import date
from functools import lru_cache
from typing import Sequence

from ..timeutil import DATE_TAG, MONTHS, format_date
from .base import MergePair

__all__ = ["ExtractiveMerger", "split_sentences", "normalize", "dedup_sentences"]

_MONTH_NO = {m: i + 1 for i, m in enumerate(MONTHS)}
_TOKEN = re.compile(r"[a-z0-9]+")
_END = re.compile(r"[.!?]+[\"'\u201d\u2019)\]]*(?=\s)")
_ABBREV = frozenset(
    "mr mrs ms dr prof sr jr st vs etc e.g i.e cf approx fig vol dept est inc ltd co mt ft "
    "gen col lt sgt capt rev hon a.m p.m u.s u.k "
    "jan feb mar apr jun jul aug sep sept oct nov dec".split())
_NEGATIONS = frozenset("not no never t nor neither none nobody nothing cannot without".split())


def normalize(sentence: str) -> tuple[str, ...]:
    """Lowercase alphanumeric token runs: ``"Mr. Smith's 2 dogs!" -> ('mr', 'smith', 's', '2', 'dogs')``."""
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
    """The tokens that contain a digit, in order."""
    return tuple(t for t in tokens if any(ch.isdigit() for ch in t))


def _in_order(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """``a`` is a subsequence of ``b`` ("paid 10 on day 3" is not a duplicate of "paid 3 on day 10")."""
    it = iter(b)
    return all(x in it for x in a)  # `in` consumes the iterator up to the match


def _is_near_duplicate(tokens: tuple[str, ...], kept: tuple[str, ...], threshold: float) -> bool:
    """Whether a sentence of ``tokens`` repeats a kept sentence of ``kept`` (module rule 3)."""
    return _repeats(tokens, set(tokens), _numbers(tokens), set(kept), _numbers(kept), threshold)


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
        >>> a = MemoryItem("a", "Caroline: I went to the support group.", 1683554160.0)  # 8 May 2023
        >>> b = MemoryItem("b", "Melanie: I painted a lake.", 1683640560.0)  # 9 May 2023
        >>> ExtractiveMerger().merge([MergePair(a, b)])
        ['[8 May 2023] Caroline: I went to the support group. [9 May 2023] Melanie: I painted a lake.']

    ``near_duplicate`` is the token-set Jaccard at or above which a sentence counts as a
    repeat of a kept one (1.0: only the same token set in another order).
    """

    name = "extractive"

    def __init__(self, *, near_duplicate: float = 0.9) -> None:
        value = near_duplicate
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise ValueError(f"near_duplicate must be in (0, 1], got {value!r}")
        self.near_duplicate = float(value)

    def __repr__(self) -> str:
        return f"ExtractiveMerger(near_duplicate={self.near_duplicate})"

    def merge(self, pairs: Sequence[MergePair]) -> list[str]:
        """One merged, non-empty text per pair, in the order of ``pairs``."""
        return [self._merge_one(p) for p in pairs]

    def _merge_one(self, pair: MergePair) -> str:
        segs = [s for item in (pair.older, pair.newer)
                for s in _segments(item.text, item.timestamp) if s[2]]
        segs.sort(key=lambda s: s[0])  # stable: older input first on equal dates
        merged: list[tuple[str, list[str]]] = []
        for _, label, sents in segs:
            if merged and merged[-1][0] == label:
                merged[-1][1].extend(sents)
            else:
                merged.append((label, list(sents)))
        groups = dedup_sentences([s for _, s in merged], self.near_duplicate)
        tagged = len(merged) > 1
        parts = [(f"[{label}] " if tagged else "") + " ".join(g)
                 for (label, _), g in zip(merged, groups) if g]
        out = " ".join(parts)
        if out:
            return out
        # Nothing but tags/whitespace in both inputs: keep the raw text, never "".
        raw = " ".join(t for t in (pair.older.text.strip(), pair.newer.text.strip()) if t)
        return raw or f"[{format_date(pair.older.timestamp)}]"
