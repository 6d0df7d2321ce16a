"""Leave-one-conversation-out choice among ``bench/long_memories.py`` cells, over every shape at once.

    python bench/long_memories_loo.py --runs OUT1,OUT2 --candidates preset:plain,nocap:plain \\
        --shapes turns,facts,w4,w8,sessions --ratios 0.5,0.7 [--metric ansr_content]

Selection metric (the one of issue 22, docs/presets.md): the mean over shapes and ratios of the
retention (the candidate's mean over the training conversations' questions divided by the
uncompressed store's) on the four training conversations; the candidate with the highest is scored
on the held-out conversation. Prints the per-fold table (Markdown) and the pooled held-out AnsR@B
and AnsR-c@B retention per shape and ratio.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from long_memories_report import load  # noqa: E402


def retention(scores, shape, cell, ratio, metric, mask) -> float:
    v, f = cell.split(":", 1)
    x = scores[f"{shape}|{v}|{ratio:g}|{f}|{metric}"][mask]
    b = scores[f"{shape}|none|0|plain|{metric}"][mask]
    return 100 * np.nanmean(x) / np.nanmean(b)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", required=True)
    p.add_argument("--candidates", required=True, help="VARIANT:FILL, comma-separated")
    p.add_argument("--shapes", required=True)
    p.add_argument("--ratios", default="0.5,0.7")
    p.add_argument("--metric", default="ansr_content")
    a = p.parse_args(argv)
    _, scores = load(a.runs.split(","))
    shapes, cands = a.shapes.split(","), a.candidates.split(",")
    ratios = [float(r) for r in a.ratios.split(",")]
    convs = sorted(set(scores[f"{shapes[0]}|tenants"].tolist()))
    print(f"| held out | chosen | train score | runner-up (train) | held out {a.metric} (mean of shapes x ratios) |")
    print("| --- | --- | --- | --- | --- |")
    chosen_by = {}
    for c in convs:
        train = {k: np.mean([retention(scores, s, k, r, a.metric, scores[f"{s}|tenants"] != c)
                             for s in shapes for r in ratios]) for k in cands}
        best = sorted(cands, key=lambda k: -train[k])
        chosen_by[c] = best[0]
        held = np.mean([retention(scores, s, best[0], r, a.metric, scores[f"{s}|tenants"] == c)
                        for s in shapes for r in ratios])
        second = f"{best[1]} ({train[best[1]]:.2f})" if len(best) > 1 else "-"
        print(f"| {c} | {best[0]} | {train[best[0]]:.2f} | {second} | {held:.1f} |")
    print("\nPooled held-out retention (each conversation scored by the candidate chosen without it), "
          "AnsR@B / AnsR-c@B %:\n")
    print("| shape | " + " | ".join(f"{r:g}" for r in ratios) + " |")
    print("|" + " --- |" * (1 + len(ratios)))
    for s in shapes:
        ten = scores[f"{s}|tenants"]
        line = []
        for r in ratios:
            out = []
            for m in ("ansr", "ansr_content"):
                cells = {c: chosen_by[c].split(":", 1) for c in convs}
                x = np.concatenate([scores[f"{s}|{cells[c][0]}|{r:g}|{cells[c][1]}|{m}"][ten == c] for c in convs])
                b = np.concatenate([scores[f"{s}|none|0|plain|{m}"][ten == c] for c in convs])
                out.append(100 * np.nanmean(x) / np.nanmean(b))
            line.append(f"{out[0]:.1f} / {out[1]:.1f}")
        print(f"| {s} | " + " | ".join(line) + " |")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    sys.exit(main())
