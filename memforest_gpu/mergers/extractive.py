"""An extractive merger: the union of two memories' sentences, minus duplicates.

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
   every segment is written with its tag, **the newest date first** (a day's sentences in
   the order they were said). Segments left empty by step 3 vanish.

So a repeated sentence keeps the date it was first said (step 3), and where two dates say
different values of one fact (a moved city, a changed job) the newer value is read first, and
first where a context or condensing keeps the head of a text (docs/method.md).

Condensing (:meth:`ExtractiveMerger.condense`, the ``cap_policy="condense"`` of
:class:`~memforest_gpu.config.MergeConfig`) keeps the sentences a merge over the node cap can
hold, in an order of salience: :mod:`.condense`.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache

from .. import sentences
from ..config import ConfigError
from ..sentences import day_of, parse, remember_written, sentence_info
from ..store.timeutil import format_date
from .base import MergePair
from .condense import SALIENCES, condense_one, has_info
from .parallel import map_parts, spare_cores

__all__ = ["ExtractiveMerger", "dedup_sentences", "has_info"]

_INDEX_ABOVE = 24  # sentences in a merge from which dedup looks up candidates by token


def _in_order(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """``a`` is a subsequence of ``b`` ("paid 10 on day 3" is not a duplicate of "paid 3 on day
    10")."""
    if not a or a == b:
        return True
    it = iter(b)
    return all(x in it for x in a)  # `in` consumes the iterator up to the match


def _repeats_one(info: tuple, kept: list, threshold: float) -> bool:
    """Whether a sentence (its :func:`sentence_info`) repeats a kept one (rule 3):
    same negations, every number of it in the kept one and in the same order, and its tokens
    contained in the kept one's (3+ tokens) or at Jaccard >= ``threshold`` with them. The
    size test first: the Jaccard index never exceeds min/max (and rounding keeps that order)."""
    _, _, a, nums, neg, numset, n, la = info
    long = n >= 3
    for _, _, b, b_nums, kneg, _, _, lb in kept:
        if not ((long and la <= lb) or min(la, lb) / max(la, lb) >= threshold):
            continue
        if kneg != neg or not numset <= b:
            continue
        if not ((long and a <= b) or (i := len(a & b)) / (la + lb - i) >= threshold):
            continue
        if _in_order(nums, b_nums):
            return True
    return False


@lru_cache(maxsize=4096)
def _least_shared(la: int, threshold: float) -> int:
    """The fewest tokens a sentence of ``la`` distinct tokens shares with one it repeats: its
    Jaccard index is at most shared/la (and rounding keeps that order); containment shares la."""
    return next(i for i in range(1, la + 1) if i / la >= threshold)


def _repeats_indexed(info: tuple, kept: list, postings: dict, threshold: float) -> bool:
    """:func:`_repeats_one` over the kept sentences that can be repeated at all: those holding one
    of any ``la - shared + 1`` of its tokens (:func:`_least_shared`), the rarest taken."""
    a, la = info[2], info[7]
    lists = sorted([postings.get(t, ()) for t in a], key=len)[:la - _least_shared(la, threshold) + 1]
    found = set(lists[0]).union(*lists[1:])
    return bool(found) and _repeats_one(info, [kept[k] for k in found], threshold)


def _dedup(groups: Sequence[Sequence[tuple]], threshold: float) -> list[list[tuple]]:
    """:func:`dedup_sentences` over the sentences' :func:`sentence_info`; with many
    sentences, each is compared only with the kept ones that share enough tokens
    (:func:`_repeats_indexed`), not with every kept one."""
    indexed = sum(map(len, groups)) >= _INDEX_ABOVE
    seen: set = set()
    kept: list[tuple] = []
    postings: dict = {}  # token -> the kept sentences that hold it
    out: list[list[tuple]] = []
    for group in groups:
        cur: list[tuple] = []
        for info in group:
            toks = info[1]
            key = toks or info[0]  # token-less text ("...", emoji) dedups verbatim
            if key in seen:
                continue
            if toks and kept and (_repeats_indexed(info, kept, postings, threshold) if indexed
                                  else _repeats_one(info, kept, threshold)):
                continue
            seen.add(key)
            if indexed:
                for t in info[2]:
                    postings.setdefault(t, []).append(len(kept))
            kept.append(info)
            cur.append(info)
        out.append(cur)
    return out


def dedup_sentences(groups: Sequence[Sequence[str]], threshold: float = 0.9) -> list[list[str]]:
    """Drop exact and near duplicates across ``groups`` (kept in order, first wins);
    returns the groups with the same shape, possibly emptied."""
    kept = _dedup([[sentence_info(s) for s in g] for g in groups], threshold)
    return [[info[0] for info in g] for g in kept]


class ExtractiveMerger:
    """Merge two memories by keeping each distinct sentence once, with date tags.

    Example::

        >>> from memforest_gpu.mergers.base import MemoryItem, MergePair
        >>> a = MemoryItem("a", "Caroline: I joined a support group.", 1683554160.0)  # 8 May 2023
        >>> b = MemoryItem("b", "Melanie: I painted a lake.", 1683640560.0)  # 9 May 2023
        >>> ExtractiveMerger().merge([MergePair(a, b)])
        ['[9 May 2023] Melanie: I painted a lake. [8 May 2023] Caroline: I joined a support group.']

    ``near_duplicate`` is the token-set Jaccard at or above which a sentence counts as a
    repeat of a kept one (1.0: only the same token set in another order). ``processes``:
    worker processes that merge parts of a batch of at least ``parallel_above`` pairs beside
    this one (:func:`~.parallel.map_parts`; default one per spare core; 0: none). The texts
    are the same whatever the split. ``salience``: the order in which condensing keeps sentences,
    ``"coverage"`` (default) or ``"centroid"`` (module docstring, "Condensing"); it never
    changes a merge that fits the cap.
    """

    name = "extractive"

    def __init__(self, *, near_duplicate: float = 0.9, processes: int | None = None,
                 parallel_above: int = 4096, salience: str = "coverage") -> None:
        if salience not in SALIENCES:
            raise ConfigError("salience", f"must be one of {list(SALIENCES)}, got {salience!r}")
        self.salience = salience
        value = near_duplicate
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise ConfigError("near_duplicate", f"must be in (0, 1], got {value!r}")
        if processes is not None and (isinstance(processes, bool) or not isinstance(processes, int) or processes < 0):
            raise ConfigError("processes", f"must be an integer >= 0 or None, got {processes!r}")
        self.near_duplicate = float(value)
        self.processes = spare_cores() if processes is None else processes
        self.parallel_above = parallel_above

    def __repr__(self) -> str:  # what decides its texts (a journal's merger identity, runs/journal.py)
        return f"ExtractiveMerger(near_duplicate={self.near_duplicate}, salience={self.salience!r})"

    @staticmethod
    def forget() -> None:
        """Empty the memos of texts and sentences read and written (:mod:`.sentences`; shared by
        every extractive merger of the process): a run calls it after its last round, when no
        text it merged is read again. Texts never depend on the memos."""
        sentences.forget()

    def merge(self, pairs: Sequence[MergePair]) -> list[str]:
        """One merged, non-empty text per pair, in the order of ``pairs``."""
        return map_parts(_merge_part, self.near_duplicate, _quads(pairs), workers=self.processes,
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
            out[j] = condense_one(labels, groups, tagged, pairs[j], cap, counter, sent_cost, tag_cost, _write,
                                  _raw(_quads([pairs[j]])[0]), self.salience)
        for j, c in zip(over, counter([out[j] for j in over])):
            dropped[j] = full[j] - c
        return out, dropped

    def _merged(self, pair: MergePair) -> tuple[list[str], list[list[str]], bool]:
        """(date labels, their deduplicated sentences, whether tags are written) of a pair."""
        labels, groups, tagged = _merged(_quads([pair])[0], self.near_duplicate)
        return labels, [[info[0] for info in g] for g in groups], tagged


def _quads(pairs: Sequence[MergePair]) -> list[tuple[str, float, str, float]]:
    """(older text, its timestamp, newer text, its timestamp) per pair: what the merge reads, and
    cheap to send to a worker process (a dataclass pickles at ~20x a tuple's cost)."""
    return [(p.older.text, p.older.timestamp, p.newer.text, p.newer.timestamp) for p in pairs]


def _merge_part(near_duplicate: float, quads: Sequence[tuple]) -> list[str]:
    """The merged texts of ``quads`` (:func:`_quads`; what :meth:`ExtractiveMerger.merge` maps
    over parts)."""
    return [_merge_one(q, near_duplicate) for q in quads]


def _segments(text: str, ts: float, out: list) -> None:
    """Append one input's ``(day ordinal, 'D Month YYYY', sentences)`` segments that have a
    sentence to ``out``, in text order (the text before the first tag has the input's date)."""
    day = day_of(ts)
    head, rest = parse(text)
    if head:
        out.append((*day, head))
    out.extend(rest)


def _first(seg: tuple) -> int:
    return seg[0]


def _merged(q: tuple, near_duplicate: float) -> tuple[list[str], list[list[str]], bool]:
    """(date labels, their deduplicated sentences, whether tags are written) of a pair's
    :func:`_quads` entry."""
    segs: list = []
    _segments(q[0], q[1], segs)
    _segments(q[2], q[3], segs)
    if len(segs) > 1:
        segs.sort(key=_first)  # stable: older input first on equal dates
    labels: list[str] = []
    groups: list = []
    for _, label, sents in segs:
        if labels and labels[-1] == label:
            groups[-1] = groups[-1] + sents  # a new list: the parsed ones are kept as read
        else:
            labels.append(label)
            groups.append(sents)
    kept = _dedup(groups, near_duplicate)  # in time order: a repeat keeps its first date
    return labels[::-1], kept[::-1], len(labels) > 1  # written the newest date first (rule 4)


def _merge_one(q: tuple, near_duplicate: float) -> str:
    labels, groups, tagged = _merged(q, near_duplicate)
    out = _write_infos(labels, groups, tagged)
    if out:
        remember_written(out, labels, groups, tagged)
        return out
    return _raw(q)


def _write(labels: Sequence[str], groups: Sequence[Sequence[str]], tagged: bool) -> str:
    if not tagged:
        return " ".join(groups[0]) if groups else ""
    return " ".join(f"[{label}] " + " ".join(g) for label, g in zip(labels, groups) if g)


def _write_infos(labels: Sequence[str], groups: Sequence[Sequence[tuple]], tagged: bool) -> str:
    """:func:`_write` of groups of :func:`sentence_info`."""
    if not tagged:
        return " ".join([info[0] for info in groups[0]]) if groups else ""
    return " ".join(f"[{label}] " + " ".join([info[0] for info in g]) for label, g in zip(labels, groups) if g)


def _raw(q: tuple) -> str:
    """Nothing but tags/whitespace in both inputs: keep the raw text, never ""."""
    raw = " ".join(t for t in (q[0].strip(), q[2].strip()) if t)
    return raw or f"[{format_date(q[1])}]"
