"""Leave-one-conversation-out choice among ``docs/studies/scripts/long_memories.py`` cells, over every shape at once.

    python docs/studies/scripts/long_memories_loo.py --runs OUT1,OUT2 --candidates preset:plain,nocap:plain \\
        --shapes turns,facts,w4,w8,sessions --ratios 0.5,0.7 [--metric ansr_content] \\
        [--max-bytes 0.5:55,0.7:40 --bytes bytes_pct|file_bytes_pct]

Selection metric (the preset selection's, docs/studies/preset-selection.md): the mean over shapes and ratios of the
retention (the candidate's mean over the training conversations' questions divided by the
uncompressed store's) on the four training conversations; the candidate with the highest is scored
on the held-out conversation. ``--max-bytes RATIO:PCT,...``: only candidates whose store is within
PCT % of the uncompressed store's bytes at RATIO on every shape are selectable (``--bytes``: the
records' raw bytes, ``bytes_pct``, or the written Parquet file's, ``file_bytes_pct``; issue 37's
targets are 0.5:55,0.7:40). Prints the per-fold table (Markdown) and the pooled held-out AnsR@B and
AnsR-c@B retention per shape and ratio.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "bench"))  # bench/common.py
sys.path.insert(0, HERE)  # the other study scripts

from long_memories_report import load  # noqa: E402


def retention(scores, shape, cell, ratio, metric, mask) -> float:
    v, f = cell.split(":", 1)
    x = scores[f"{shape}|{v}|{ratio:g}|{f}|{metric}"][mask]
    b = scores[f"{shape}|none|0|plain|{metric}"][mask]
    return 100 * np.nanmean(x) / np.nanmean(b)


def within_bytes(records: list[dict], cands: list[str], shapes: list[str], spec: str, field: str) -> list[str]:
    """The candidates whose ``field`` (% of the uncompressed store) is within ``spec``'s bound at every
    ratio it names on every shape; prints each one left out and why."""
    limits = {float(r): float(x) for r, x in (t.split(":") for t in filter(None, spec.split(",")))}
    if not limits:
        return cands
    by = {(r["shape"], r["variant"], r["ratio"]): r.get(field) for r in records}
    keep = []
    for c in cands:
        over = [f"{s} {r:g}: {by.get((s, c.split(':')[0], r))}" for s in shapes for r, lim in limits.items()
                if by.get((s, c.split(":")[0], r)) is None or by[(s, c.split(":")[0], r)] > lim]
        if over:
            print(f"- {c} not selectable ({field} over the bound): " + ", ".join(
                x if x.endswith("None") else f"{x.rsplit(': ', 1)[0]}: {float(x.rsplit(': ', 1)[1]):.0f}%"
                for x in over))
        else:
            keep.append(c)
    print()
    if not keep:
        raise SystemExit("no candidate within the byte bounds")
    return keep


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", required=True)
    p.add_argument("--candidates", required=True, help="VARIANT:FILL, comma-separated")
    p.add_argument("--shapes", required=True)
    p.add_argument("--ratios", default="0.5,0.7")
    p.add_argument("--metric", default="ansr_content")
    p.add_argument("--max-bytes", default="", help="RATIO:PCT,... (issue 37: 0.5:55,0.7:40)")
    p.add_argument("--bytes", default="bytes_pct", choices=("bytes_pct", "file_bytes_pct"))
    a = p.parse_args(argv)
    records, scores = load(a.runs.split(","))
    shapes, cands = a.shapes.split(","), a.candidates.split(",")
    ratios = [float(r) for r in a.ratios.split(",")]
    cands = within_bytes(records, cands, shapes, a.max_bytes, a.bytes)
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
    sys.path.insert(0, os.path.join(HERE, "..", "..", ".."))
    sys.exit(main())
