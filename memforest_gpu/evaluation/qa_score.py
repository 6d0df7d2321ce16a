"""Scoring an LLM's answer: token F1 and BLEU-1 against the gold answer, the judge's verdict,
a multiple-choice letter, and whether an answer is a refusal. Plain functions on strings.

- **F1** (token F1, as in SQuAD and the Mem0 paper's F1 column): precision and recall of the
  answer's tokens against the gold answer's (lowercase alphanumeric runs, articles removed,
  counted with multiplicity); 1 when both are empty.
- **BLEU-1** (the Mem0 paper's B1): clipped unigram precision of the answer against the gold
  answer, times the brevity penalty ``exp(1 - r / c)`` when the answer (``c`` tokens) is
  shorter than the gold (``r``); same tokens as F1.

>>> round(token_f1("Miso, her cat", "Miso"), 3)
0.5
>>> parse_verdict("Reasoning: the dates match.\\nCORRECT")
'CORRECT'
>>> parse_choice("The answer is (b).", 4)
1
"""
from __future__ import annotations

import math
import re
from collections import Counter

__all__ = ["qa_tokens", "token_f1", "bleu1", "parse_verdict", "parse_choice", "is_refusal", "VERDICTS"]

VERDICTS = ("CORRECT", "WRONG")
_TOKEN = re.compile(r"[a-z0-9]+")
_ARTICLES = frozenset({"a", "an", "the"})
_VERDICT = re.compile(r"\b(CORRECT|INCORRECT|WRONG)\b")
_PAREN = re.compile(r"\(([a-z])\)")
_REFUSAL = re.compile(
    r"\b(i (?:do not|don't|cannot|can't|am unable to|am not able to) (?:know|tell|say|answer|determine|find|recall)"
    r"|(?:no|not enough|insufficient) (?:information|memories|memory|details|context)"
    r"|(?:is|was|are) not (?:mentioned|stated|provided|available|specified|given)"
    r"|(?:cannot|can't|unable to) (?:be )?(?:answer|determine|determined|tell|find)"
    r"|not possible to (?:answer|determine|tell)|i'm sorry|i am sorry|as an ai)\b")


def qa_tokens(text: str) -> list[str]:
    """Lowercase alphanumeric runs without articles: ``"The 2 cats." -> ['2', 'cats']``."""
    return [t for t in _TOKEN.findall(str(text).lower()) if t not in _ARTICLES]


def token_f1(answer: str, gold: str) -> float:
    """Token F1 of ``answer`` against ``gold`` (see the module docstring)."""
    a, g = qa_tokens(answer), qa_tokens(gold)
    if not a or not g:
        return float(a == g)
    common = sum((Counter(a) & Counter(g)).values())
    if common == 0:
        return 0.0
    p, r = common / len(a), common / len(g)
    return 2 * p * r / (p + r)


def bleu1(answer: str, gold: str) -> float:
    """BLEU-1 of ``answer`` against ``gold`` (see the module docstring)."""
    a, g = qa_tokens(answer), qa_tokens(gold)
    if not a or not g:
        return float(a == g)
    clipped = sum((Counter(a) & Counter(g)).values())
    bp = 1.0 if len(a) >= len(g) else math.exp(1 - len(g) / len(a))
    return bp * clipped / len(a)


def parse_verdict(reply: str | None) -> str | None:
    """The judge's label: the last of CORRECT / WRONG (INCORRECT counts as WRONG) in the reply,
    so a reasoning line before the label does not count; None when there is none."""
    if not reply:
        return None
    found = _VERDICT.findall(reply.upper())
    if not found:
        return None
    return "CORRECT" if found[-1] == "CORRECT" else "WRONG"


def parse_choice(reply: str | None, n_options: int, options: tuple[str, ...] = ()) -> int | None:
    """The option a multiple-choice reply picks (0-based), or None when it names none or
    several: a single letter in parentheses, ``(b)``; else a reply that is one letter, ``b``
    or ``B.``; else the one option whose text the reply contains."""
    if not reply:
        return None
    text = reply.strip().lower()
    letters = {ord(x) - 97 for x in _PAREN.findall(text)} & set(range(n_options))
    if len(letters) == 1:
        return letters.pop()
    m = re.fullmatch(r"(?:answer:?\s*)?([a-z])[.)]?", text)
    if m and ord(m.group(1)) - 97 < n_options:
        return ord(m.group(1)) - 97
    hits = [i for i, o in enumerate(options) if o and o.lower() in text]
    return hits[0] if len(hits) == 1 else None


def is_refusal(answer: str | None) -> bool:
    """True when the answer declines ("I don't know", "not mentioned", "no information")."""
    return bool(answer) and _REFUSAL.search(answer.lower()) is not None
