"""A memory text read as sentences: date segments, sentences and their tokens.

The rules are the extractive merger's (:mod:`.mergers.extractive`, steps 1 and 3); retrieval,
the review page and the evaluation split texts with them too. This module reads texts and
remembers what it read, since progressive merging reads the same sentences again in every later
merge of their node:

- :func:`parse` gives a text's sentences before its first date tag and each valid tag's day
  and sentences, each sentence with its :func:`sentence_info` (tokens, numbers, negations;
  kept for the sentences seen last);
- :func:`remember_written` keeps how the merger wrote a text (the sentences it read, with
  their infos); when that text is parsed again (merged again) and reading it back is sure to
  give the same sentences and tags (:func:`written_reads_back`), the parse is taken from
  there instead of cutting the text again. :class:`Recent` bounds what is kept.

Nothing kept changes a result: a text or sentence not found is read as if it were new.
"""
from __future__ import annotations

import math
import re
from datetime import date
from functools import lru_cache

from .store.timeutil import DATE_TAG, MONTHS, format_date

__all__ = ["normalize", "split_sentences", "parse", "read", "sentence_info", "day_of", "day_ordinal",
           "remember_written", "written_reads_back", "forget", "Recent", "NEGATIONS"]

MONTH_NO = {m: i + 1 for i, m in enumerate(MONTHS)}
_TOKEN = re.compile(r"[a-z0-9]+")
_END = re.compile(r"[.!?]+[\"'\u201d\u2019)\]]*(?=\s)")
_NEXT_WORD = re.compile(r"\s*(\S*)")  # \s is str.isspace, the whitespace of str.split()
_QUOTES = "\"'\u201d\u2019"
_CLOSERS = "\"'\u201d\u2019)]"
_OPENERS = "\"'\u201c\u2018(["
_ABBREV = frozenset(
    "mr mrs ms dr prof sr jr st vs etc e.g i.e cf approx fig vol dept est inc ltd co mt ft "
    "gen col lt sgt capt rev hon a.m p.m u.s u.k "
    "jan feb mar apr jun jul aug sep sept oct nov dec".split())
NEGATIONS = frozenset("not no never t nor neither none nobody nothing cannot without".split())


class Recent:
    """A bounded memo: the entries put since the last turnover, and those of the turnover
    before (at most ``2 * size`` entries); O(1) get and put."""

    def __init__(self, size: int) -> None:
        self.size, self.new, self.old = size, {}, {}

    def get(self, key):
        got = self.new.get(key)
        return got if got is not None else self.old.get(key)

    def put(self, key, value) -> None:
        if len(self.new) >= self.size:
            self.old, self.new = self.new, {}
        self.new[key] = value


_STATUS = Recent(1 << 14)
_WRITTEN = Recent(1 << 12)
#: the fewest sentences of a merged text kept to be read back: a shorter one is read again (as
#: cheap as the lookup, and a matching round's many short texts would only fill the memo)
MEMO_FROM = 8
_DAYS: dict[str, int] = {}
_BY_DAY: dict[float, tuple[int, str]] = {}
_LABEL_OK: dict[str, bool] = {}


def normalize(sentence: str) -> tuple[str, ...]:
    """Lowercase alphanumeric token runs: ``"Mr. Smith's 2 dogs!" -> ('mr', 'smith', 's', '2',
    'dogs')``."""
    return tuple(_TOKEN.findall(sentence.lower()))


def _word_before(text: str, pos: int) -> str:
    """The last whitespace-delimited word of ``text[:pos]`` ("" when there is none)."""
    j = pos
    while j and text[j - 1].isspace():
        j -= 1
    i = j
    while i and not text[i - 1].isspace():
        i -= 1
    return text[i:j]


def _no_split(text: str, m: re.Match) -> bool:
    """True when the punctuation at ``m`` ends an abbreviation, an initial or a date,
    or closes a quote that the sentence goes on after (``"Really?" she asked.``)."""
    nxt = _NEXT_WORD.match(text, m.end()).group(1)
    g = m.group()
    if g[-1] in _QUOTES and nxt[:1].islower():
        return True
    if g.rstrip(_CLOSERS) != ".":
        return False
    word = _word_before(text, m.start()).lstrip(_OPENERS)
    low = word.lower()
    if low in _ABBREV or (len(word) == 1 and "A" <= word <= "Z"):
        return True
    if low == "no" and nxt[:1].isdigit():  # "No. 5"
        return True
    return word.isdigit() and nxt.rstrip(",.") in MONTH_NO  # "8. May 2023"


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


@lru_cache(maxsize=1 << 14)
def sentence_info(sent: str) -> tuple:
    """(sentence, tokens, token set, numbers, negations, numbers as a set, token count, set size);
    numbers are the tokens with a digit (tokens are ``[a-z0-9]+``: the ones not all letters)."""
    low = sent.lower()
    toks = tuple(_TOKEN.findall(low))
    a = frozenset(toks)
    nums = tuple(t for t in toks if not t.isalpha())
    return sent, toks, a, nums, a & NEGATIONS, frozenset(nums), len(toks), len(a)


def day_of(ts: float) -> tuple[int, str]:
    """(day ordinal, :func:`~memforest_gpu.store.timeutil.format_date` label) of a timestamp."""
    ts = float(ts)
    day = ts // 86400.0
    plain = math.isfinite(day) and ts - day * 86400.0 < 86399.999  # the label is a function of the day
    got = _BY_DAY.get(day) if plain else None
    if got is None:
        label = format_date(ts)
        got = (day_ordinal(label), label)
        if plain:
            _BY_DAY[day] = got
    return got


def day_ordinal(label: str) -> int:
    """The proleptic ordinal of a ``'D Month YYYY'`` label (the sort key of its segment)."""
    got = _DAYS.get(label)
    if got is None:
        day, month, year = label.split()
        got = _DAYS[label] = date(int(year), MONTH_NO[month], int(day)).toordinal()
    return got


def parse(text: str) -> tuple[list[str], list[tuple[int, str, list[str]]]]:
    """:func:`read`; a text the merger wrote is parsed from how it was written when it reads back
    for sure (:func:`remember_written`)."""
    w = _WRITTEN.get(text)
    return (w is not None and _from_written(*w)) or read(text)


def read(text: str) -> tuple[list[str], list[tuple[int, str, list[str]]]]:
    """(the sentences before the first date tag, [(day ordinal, 'D Month YYYY', sentences)] of
    each later segment that has a sentence, in text order). A tag counts at the start of the
    text or after whitespace, and only for a real day ("[31 February 2023]" is text)."""
    segs = []
    pos, head = 0, None
    if "[" in text:
        for m in DATE_TAG.finditer(text):
            try:
                key = date(int(m.group(3)), MONTH_NO[m.group(2)], int(m.group(1)))
            except ValueError:  # "[31 February 2023]" is text, not a tag
                continue
            if head is None:
                head = text[:m.start()]
            else:
                segs[-1][2] = text[pos:m.start()]
            segs.append([key.toordinal(), f"{key.day} {m.group(2)} {key.year}", None])
            pos = m.end()
    if head is None:
        head = text
    else:
        segs[-1][2] = text[pos:]
    return _infos(head), [(k, lab, sents) for k, lab, t in segs if (sents := _infos(t))]


def _infos(text: str) -> list[tuple]:
    return [sentence_info(s) for s in split_sentences(text)]


def forget() -> None:
    """Empty every memo (benchmarks start cold; results never depend on them)."""
    for memo in (_STATUS, _WRITTEN):
        memo.new, memo.old = {}, {}
    sentence_info.cache_clear()


def _label_reads_back(label: str) -> bool:
    """Whether ``[label]`` written in a text is read back as a tag of that label (a year
    before 1000 is written with fewer than 4 digits and is not)."""
    got = _LABEL_OK.get(label)
    if got is None:
        m = DATE_TAG.fullmatch(f"[{label}]")
        got = m is not None and f"{int(m.group(1))} {m.group(2)} {int(m.group(3))}" == label
        if got:
            try:
                date(int(m.group(3)), MONTH_NO[m.group(2)], int(m.group(1)))
            except ValueError:
                got = False
        _LABEL_OK[label] = got
    return got


def _reads_back(sent: str) -> int:
    """How a sentence read from a text reads back when written with a space before it and
    another sentence after: 0 when it may not (it starts with ``. ! ?``, where a cut depends on
    the word before, or holds a date tag), 2 when it is also cut at its end whatever word
    follows, else 1 (fine as a segment's last sentence)."""
    got = _STATUS.get(sent)
    if got is not None:
        return got
    got = 0
    if sent[0] not in ".!?" and DATE_TAG.search(sent) is None:
        got = 1
        line = sent + " "
        ends = list(_END.finditer(line))
        last = ends[-1] if ends else None
        if last is not None and last.end() == len(sent):
            g = last.group()
            if g[-1] in _QUOTES:
                pass  # splits or not by the next word's case
            elif g.rstrip(_CLOSERS) != ".":
                got = 2
            else:
                word = _word_before(line, last.start()).lstrip(_OPENERS)
                low = word.lower()
                if not (low in _ABBREV or (len(word) == 1 and "A" <= word <= "Z") or low == "no" or word.isdigit()):
                    got = 2
    _STATUS.put(sent, got)
    return got


def written_reads_back(labels, groups, tagged: bool) -> bool:
    """Whether :func:`parse` of the text written from ``groups`` (:func:`sentence_info` of
    sentences :func:`parse` read, ``" "`` between them, each non-empty group after
    ``"[label] "`` when ``tagged``) gives those sentences and tags back: every label reads back
    as its tag, and every sentence reads back (:func:`_reads_back`: 2, or 1 for a group's last)."""
    for label, g in zip(labels, groups):
        if not g:
            continue
        if tagged and not _label_reads_back(label):
            return False
        for s in g[:-1]:
            if _reads_back(s[0]) != 2:
                return False
        if not _reads_back(g[-1][0]):
            return False
    return True


def remember_written(text: str, labels, groups, tagged: bool) -> None:
    """Keep how ``text`` was written from parsed sentences (see :func:`written_reads_back`):
    when it is parsed (merged again) and reads back for sure, the parse is taken from there.
    Only texts of :data:`MEMO_FROM` sentences or more are kept."""
    if sum(map(len, groups)) >= MEMO_FROM:
        _WRITTEN.put(text, (labels, groups, tagged))


def _from_written(labels, groups, tagged: bool):
    """The parse of a text written from ``groups``, or None when reading it back may differ."""
    if not written_reads_back(labels, groups, tagged):
        return None
    if tagged:
        return [], [(day_ordinal(lab), lab, g) for lab, g in zip(labels, groups) if g]
    return (groups[0] if groups else []), []
