"""Per-merge time of the extractive merger against its frozen reference (tests/extractive_reference.py,
the merger before its per-merge work was cut), interleaved in one process on the same pairs, so the
ratio holds on a busy machine.

    PYTHONPATH=. python bench/merger_speed.py
    PYTHONPATH=. python bench/merger_speed.py --nodes 20000 --repeats 5 --processes 1

Workloads: the synthetic benchmark store's texts (memforest_gpu/store/synthetic.py) and the
LoCoMo dev file's turns and facts, each merged in random pairs and the texts fed back as
inputs ``--levels`` times (merges of merges, as progressive merging does), every chain from
cold memos; and ``condense`` of the last level's pairs at a word cap. Both sides run in this
process (``--processes 0``, the per-merge work) unless ``--processes`` says otherwise (both
then use worker processes for batches of ``--parallel-above`` pairs or more). Prints
microseconds per merge of each side (best of ``--repeats``) and the ratio: this process's CPU
time in process (less swayed by other work on a shared machine), wall time with workers.
"""
from __future__ import annotations

import argparse
import os
import pickle
import random
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import extractive_reference as ref_module  # noqa: E402
from extractive_corpus import dev_items, merge_levels, synthetic_items  # noqa: E402

from memforest_gpu import sentences  # noqa: E402
from memforest_gpu.mergers.base import MergePair  # noqa: E402
from memforest_gpu.mergers.extractive import ExtractiveMerger  # noqa: E402
from memforest_gpu.mergers.word_count import count_words  # noqa: E402


def chain(merger, items, levels: int, seed: int, clock=time.process_time) -> tuple[float, int, list]:
    """Seconds spent in ``merger.merge`` over ``levels`` levels of merges of merges, the
    number of merges, and the last level's pairs."""
    spent, n, last = 0.0, 0, []

    def timed(pairs):
        nonlocal spent, n, last
        t = clock()
        out = merger.merge(pairs)
        spent += clock() - t
        n, last = n + len(pairs), pairs
        return out

    for _ in merge_levels(timed, items, random.Random(seed), levels):
        pass
    return spent, n, last


def cold() -> None:
    ref_module._sentence_info.cache_clear()
    sentences.forget()


def compare(name: str, items, a) -> None:
    mk = {"reference": ref_module.ExtractiveMerger, "new": ExtractiveMerger}
    best = {k: float("inf") for k in mk}
    best_c = dict(best)
    clock = time.process_time if a.processes == 0 else time.perf_counter
    for r in range(a.repeats):
        for side in (("reference", "new") if r % 2 == 0 else ("new", "reference")):
            m = mk[side](processes=a.processes, parallel_above=a.parallel_above)
            cold()
            s, n, last = chain(m, items, a.levels, seed=r, clock=clock)
            best[side] = min(best[side], s / n * 1e6)
            t = clock()
            m.condense(last, a.cap, count_words)
            best_c[side] = min(best_c[side], (clock() - t) / len(last) * 1e6)
    print(f"{name:>10} merge    {n:>7} merges: reference {best['reference']:7.2f} us, new {best['new']:7.2f} us,"
          f" ratio {best['reference'] / best['new']:5.2f}x")
    print(f"{name:>10} condense {len(last):>7} pairs:  reference {best_c['reference']:7.2f} us,"
          f" new {best_c['new']:7.2f} us, ratio {best_c['reference'] / best_c['new']:5.2f}x")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=20000, help="synthetic texts")
    ap.add_argument("--levels", type=int, default=4, help="levels of merges of merges")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cap", type=int, default=24, help="condense's word cap")
    ap.add_argument("--processes", type=int, default=0, help="worker processes (both sides)")
    ap.add_argument("--parallel-above", type=int, default=4096)
    a = ap.parse_args(argv)
    compare("synthetic", synthetic_items(a.nodes), a)
    dev = dev_items("turns") + dev_items("facts")
    if dev:
        compare("dev file", dev, a)
    pickled()


def pickled(n: int = 20000) -> None:
    """What sending a batch to a worker costs per pair: the pairs as dataclasses (the reference)
    or as the tuples the merger now sends (dumps and loads, this process's CPU time)."""
    items = synthetic_items(2 * n)
    pairs = [MergePair(x, y) for x, y in zip(items[::2], items[1::2])]
    quads = [(p.older.text, p.older.timestamp, p.newer.text, p.newer.timestamp) for p in pairs]
    for name, obj in (("dataclasses", pairs), ("tuples", quads)):
        t = time.process_time()
        pickle.loads(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL))
        print(f"{'pickling':>10} {name:>11}: {(time.process_time() - t) / n * 1e6:6.2f} us a pair")


if __name__ == "__main__":
    main()
