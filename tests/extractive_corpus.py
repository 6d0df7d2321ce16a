"""Pairs of memories for comparing two extractive mergers text for text: the LoCoMo dev file's
turns and facts paired in many ways, merges of merges several levels deep, and hand-written
texts that probe the rules' corners (abbreviations, numbers, negations, quotes, unicode,
date tags, near-empty texts, odd timestamps). Used by tests/test_extractive_same.py and
bench/merger_speed.py."""
from __future__ import annotations

import os
import random

from memforest_gpu.mergers.base import MemoryItem, MergePair

DEV = "/work/shared/data/locomo_dev5.json"
DAY = 86400.0
T0 = 1683554160.0  # 8 May 2023, 13:56 UTC

#: sentences and fragments that probe splitting, dedup and date tags
TRICKY = [
    "Dr. Smith met Mr. Jones at 3 p.m. on Jan. 5th.", "Dr. Smith met Mr. Jones at 3 p.m. on Jan. 5th!",
    "I did not go to the park.", "I did go to the park.", "I never went to the park.", "She can't swim.",
    "She can swim.", "\"Really?\" she asked. \"Yes!\" he said.", "He said \u201cgo away.\u201d Then he left.",
    "Paid 10 on day 3.", "Paid 3 on day 10.", "Paid 10 on day 3 and 4.", "It costs 3.5 dollars, i.e. cheap.",
    "No. 5 is my favourite.", "We met on 8. May 2023 at noon.", "J. R. R. Tolkien wrote it (vol. 2).",
    "Caf\u00e9 cr\u00e8me br\u00fbl\u00e9e \u2014 d\u00e9licieux!",
    "\u65e5\u672c\u8a9e\u306e\u6587\u3002 \u3082\u3046\u4e00\u3064\u3002",
    "\U0001f600\U0001f389", "...", "!!!", "?! Huh.", ". . .", "", "   ", "\n\n", "ok", "Hey Mel",
    "[8 May 2023]", "[8 May 2023] ", "Note [9 May 2023] inside a sentence.", "[31 February 2023] not a tag.",
    "[8 May 0999] an ancient tag.", "[08 May 2023] padded day.", "x [1 January 2020] y [2 January 2020] z",
    "line one\nline two.\r\nline three!\u2028line four", "Tabs\tand  double  spaces.  End.",
    "Caroline: I joined a support group on Friday.", "Caroline: I joined a support group.",
    "Melanie painted a lake at sunrise last weekend with her kids.",
    "melanie painted a lake at sunrise last weekend with her two kids",
    "Nothing else happened.", "The user visited Porto in June.", "St. Louis is in the U.S. of A.",
    "She said 'fine.' and left.", "A (very) short one.]", "Done.) Next one.", "WAIT. STOP.",
]


def item(text: str, ts: float, key: str = "x") -> MemoryItem:
    return MemoryItem(key, text, ts)


def dev_items(nodes: str) -> list[MemoryItem]:
    """The dev file's turns or facts as items, in file order (empty when the file is absent)."""
    if not os.path.exists(DEV):
        return []
    from memforest_gpu.evaluation.locomo import load_locomo

    return [item(n["text"], n["timestamp"], n["id"]) for n in load_locomo(DEV, nodes=nodes).nodes]


def tricky_items(rng: random.Random, n: int) -> list[MemoryItem]:
    """``n`` items of one to four tricky pieces each, on odd days (year 999, midnight, far future)."""
    days = [T0, T0 + DAY, T0 + 0.5, T0 + 40 * DAY, -3.0e10, -3.3e10, -6.2e10, 86400.0 * 19485 - 0.0004, 2.5e11, 0.0]
    out = []
    for k in range(n):
        parts = rng.sample(TRICKY, rng.randint(1, 4))
        sep = rng.choice([" ", "\n", "  ", " \t"])
        out.append(item(sep.join(parts), rng.choice(days) + rng.random() * rng.choice([0, 1, DAY]), f"t{k}"))
    return out


def pairs_of(items: list[MemoryItem], rng: random.Random, n: int) -> list[MergePair]:
    """Adjacent pairs (same day, mostly), random pairs (other days) and self pairs."""
    if len(items) < 2:
        return []
    out = []
    for k in range(n):
        kind = k % 5
        if kind < 2:
            i = rng.randrange(len(items) - 1)
            a, b = items[i], items[i + 1]
        elif kind < 4:
            a, b = rng.sample(items, 2)
        else:
            a = rng.choice(items)
            b = item(a.text, a.timestamp + rng.choice([0.0, 10.0, DAY, 30 * DAY]), "copy")
        out.append(MergePair(a, b) if a.timestamp <= b.timestamp else MergePair(b, a))
    return out


def merge_levels(merge, items: list[MemoryItem], rng: random.Random, levels: int):
    """Merge ``items`` in random pairs, feed the texts back as items (a new timestamp: the
    newer input's, or a day or a month on), ``levels`` times. Yields each level's pairs; ``merge``
    (pairs -> texts) writes the texts fed back."""
    cur = list(items)
    for _ in range(levels):
        rng.shuffle(cur)
        pairs = [MergePair(*sorted((cur[i], cur[i + 1]), key=lambda m: m.timestamp))
                 for i in range(0, len(cur) - 1, 2)]
        yield pairs
        texts = merge(pairs)
        shift = [0.0, 0.0, DAY, 31 * DAY]
        cur = [item(t, p.newer.timestamp + rng.choice(shift), f"m{i}") for i, (p, t) in enumerate(zip(pairs, texts))]
        if len(cur) < 2:
            return


def synthetic_items(n: int, seed: int = 0) -> list[MemoryItem]:
    """Texts like the benchmark's synthetic store (memforest_gpu/store/synthetic.py), one an hour."""
    from memforest_gpu.store.synthetic import synthetic_store

    s = synthetic_store(n, tenants=1, dim=8, seed=seed, device="cpu")
    return [item(t, float(ts), str(i)) for i, (t, ts) in enumerate(zip(list(s.texts), s.timestamps.tolist()))]
