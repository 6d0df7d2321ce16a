"""Validation of an LLM's merged text: plain functions, one reason string per failure.

``check_merge(text, pair)`` returns ``None`` for an acceptable merge, else a short reason
that reads after "the answer ..." (it is quoted back to the model in the strict retry)::

    >>> from memforest_gpu.mergers.base import MemoryItem, MergePair
    >>> pair = MergePair(MemoryItem("a", "Bob ran 5 km.", 1683554160.0),
    ...                  MemoryItem("b", "Bob ran again.", 1683554160.0))
    >>> check_merge("Bob ran 5 km, then again.", pair) is None
    True
    >>> check_merge("Bob ran twice.", pair)
    'dropped the number 5'

Rules, in order:

1. not empty (after :func:`clean_output` strips wrappers such as quotes, code fences and
   "Merged memory:");
2. not a refusal ("I'm sorry", "I can't", "As an AI" ...), unless the inputs themselves
   say that phrase; not an echo of the prompt's ``<memory_1>`` tags;
3. at most ``words(older) + words(newer) + slack`` words;
4. every number of the inputs survives. Dates may be rewritten in another format, so an
   ISO or slashed date inside an input only needs its year (and ISO its day), and numbers are
   compared
   without leading zeros or thousands separators ("1,200" == "1200"; "08" == "8");
   small number words count ("three" for 3);
5. when the two inputs are of different days, each input's date (from its timestamp)
   survives: its year, its day and its month (a name, an abbreviation or ``YYYY-MM``).
"""
from __future__ import annotations

import re
from datetime import UTC, datetime

from .base import MergePair

__all__ = ["check_merge", "clean_output", "required_numbers", "number_set"]

# Dates whose month (and for D/M/Y, day) may be rewritten as a name: only the listed
# groups must survive. Any other number, including the day and year of "8 May 2023", must.
_DATES = [(re.compile(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b"), (1, 3)),  # 2023-05-08
          (re.compile(r"\b(\d{1,2})[/.](\d{1,2})[/.](\d{4})\b"), (3,))]  # 8/5/2023, 5.8.2023
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_DIGITS = re.compile(r"\d+")
_WORDS = {w: str(i) for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty".split())}
_WORD = re.compile(r"\b(" + "|".join(_WORDS) + r")\b", re.IGNORECASE)
_REFUSAL = re.compile(
    r"^\W*(i'?m sorry|i am sorry|sorry,|i apologi[sz]e|i can'?t|i cannot|i can not|i am unable|i'?m unable|"
    r"i am not able|i'?m not able|i won'?t|i will not|as an ai\b)|\bas an ai (language )?model\b",
    re.IGNORECASE)
_PREFIX = re.compile(r"^\s*(?:\*\*)?(?:here is (?:the )?merged memory|merged memory|merged entry|merged|memory|"
                     r"output|answer|result)(?:\*\*)?\s*:\s*(?:\*\*)?", re.IGNORECASE)
_FENCE = re.compile(r"^```[a-z]*\s*\n?(.*?)\n?```$", re.DOTALL)
_QUOTES = (('"', '"'), ("'", "'"), ("\u201c", "\u201d"), ("\u2018", "\u2019"))


def clean_output(text: str | None) -> str:
    """Strip what models wrap an answer in: whitespace, a code fence, a label such as
    "Merged memory:", matching outer quotes, ``<merged>`` tags. ``None`` -> ``""``."""
    if not text:
        return ""
    s = text.strip()
    for _ in range(3):  # wrappers may nest: ```"Merged: '...'"```
        before = s
        m = _FENCE.match(s)
        if m:
            s = m.group(1).strip()
        s = _PREFIX.sub("", s, count=1).strip()
        s = re.sub(r"^<(merged(?:_memory)?|memory)>\s*(.*?)\s*</\1>$", r"\2", s, flags=re.DOTALL | re.IGNORECASE)
        for a, b in _QUOTES:
            if len(s) >= 2 and s[0] == a and s[-1] == b and a not in s[1:-1] and b not in s[1:-1]:
                s = s[1:-1].strip()
        if s == before:
            break
    return s


def _norm(tok: str) -> str:
    """'1,200' -> '1200', '08' -> '8', '3.50' -> '3.50', '0' -> '0'."""
    if re.fullmatch(r"\d{1,3}(?:,\d{3})+", tok):
        tok = tok.replace(",", "")
    tok = tok.replace(",", ".")  # "3,5" (decimal comma) and "3.5" compare equal
    head, dot, tail = tok.partition(".")
    return (head.lstrip("0") or "0") + dot + tail


def required_numbers(text: str) -> set[str]:
    """Numbers of an input that a merge must keep: dates reduced to year and day.

    >>> sorted(required_numbers("On 2023-05-08 Bob paid $1,200 for 3 tickets."))
    ['1200', '2023', '3', '8']
    """
    need: set[str] = set()
    chars = list(text)
    for pat, keep in _DATES:
        for m in pat.finditer("".join(chars)):
            need.update(_norm(m.group(g)) for g in keep)
            chars[m.start():m.end()] = " " * (m.end() - m.start())
    rest = "".join(chars)
    need.update(_norm(t) for t in _NUMBER.findall(rest))
    return need


def number_set(text: str) -> set[str]:
    """Every number a text shows, in every reading: '1,200.5' gives '1200.5', '1', '200', '5'..."""
    out = {_norm(t) for t in _NUMBER.findall(text)}
    out.update(_norm(t) for t in _DIGITS.findall(text))
    out.update(_WORDS[w.lower()] for w in _WORD.findall(text))
    return out


def _date_kept(ts: float, text: str, nums: set[str]) -> bool:
    d = datetime.fromtimestamp(float(ts), tz=UTC)
    if str(d.year) not in nums or str(d.day) not in nums:
        return False
    name = f"{d:%B}"
    return bool(re.search(rf"\b{name[:3]}", text, re.IGNORECASE)) or f"{d.year}-{d.month:02d}" in text


def check_merge(text: str, pair: MergePair, slack: int = 12) -> str | None:
    """``None`` when ``text`` is an acceptable merge of ``pair``, else the reason.

    ``text`` should already be :func:`clean_output`-ed. ``slack``: extra words allowed
    over the two inputs together (room for the dates the prompt asks to write).
    """
    a, b = pair.older.text, pair.newer.text
    if not text or not text.strip():
        return "was empty"
    m = _REFUSAL.search(text)
    if m and m.group(0).strip().lower() not in (a + " " + b).lower():
        return "was a refusal, not a merged memory"
    if re.search(r"</?memory_\d", text, re.IGNORECASE):
        return "repeated the <memory> tags instead of writing one memory"
    n, limit = len(text.split()), len(a.split()) + len(b.split()) + slack
    if n > limit:
        return f"was too long ({n} words; at most {limit} allowed)"
    have = number_set(text)
    lost = sorted((required_numbers(a) | required_numbers(b)) - have, key=lambda t: (len(t), t))
    if lost:
        return f"dropped the number{'s' if len(lost) > 1 else ''} {', '.join(lost[:5])}"
    if datetime.fromtimestamp(pair.older.timestamp, tz=UTC).date() != \
            datetime.fromtimestamp(pair.newer.timestamp, tz=UTC).date():
        for item in (pair.older, pair.newer):
            if not _date_kept(item.timestamp, text, have):
                d = datetime.fromtimestamp(float(item.timestamp), tz=UTC)
                return f"dropped the date {d.day} {d:%B} {d.year}"
    return None
