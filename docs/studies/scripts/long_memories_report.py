"""Tables of ``docs/studies/scripts/long_memories.py`` runs: lost answers by cause, remedies, cluster bootstrap.

    python docs/studies/scripts/long_memories_report.py --runs OUT1,OUT2 --causes preset:plain \\
        --compare nocap:matched,preset:matched --against preset:plain [--metric ansr]

Prints Markdown: per shape and ratio the retention (AnsR@B / AnsR-c@B / EvR@B, %), the ratio
reached, bytes against the uncompressed store, and the lost answers by cause (answers / points of the
uncompressed mean); then each ``--compare`` cell minus ``--against`` in retention points of
``--metric`` with its 95% cluster bootstrap interval (conversations, then questions; 2,000
resamples; ``*`` beyond the noise), overall and per category of 20 questions or more; and each
``--retention`` cell's retention with its own interval (the same resamples).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np


def load(runs: list[str]) -> tuple[list[dict], dict]:
    records, scores, seen = [], {}, set()
    for r in runs:
        with open(os.path.join(r, "records.json")) as f:
            for rec in json.load(f):  # a cell made by several runs: the first run's
                key = (rec["shape"], rec["variant"], rec["ratio"], rec["fill"])
                if key not in seen:
                    seen.add(key)
                    records.append(rec)
        with np.load(os.path.join(r, "scores.npz"), allow_pickle=False) as z:
            scores.update({k: z[k] for k in z.files})
    return records, scores


def causes_table(records: list[dict], cell: str) -> str:
    variant, fill = cell.split(":", 1)
    rows = ["| shape | ratio | reached | bytes % | words/node | AnsR@B / AnsR-c@B / EvR@B % | lost answers (points): "
            "condensed | crowded | not found | too long | other | no evidence | all |", "|" + " --- |" * 12]
    for r in records:
        if r["variant"] != variant or r["fill"] != fill:
            continue
        lost = r["lost"]
        cells = " | ".join(f"{lost[c]['answers']} ({lost[c]['points']:.1f})"
                           for c in ("condensed", "crowded", "not_found", "too_long", "other", "no_evidence", "all")
                           if c in lost)
        kept = f"{r['ansr']:.1f} / {r['ansr_content']:.1f} / {r['evr']:.1f}"
        rows.append(f"| {r['shape']} | {r['ratio']:g} | {r['ratio_reached']:.3f} | {r['bytes_pct']:.0f} | "
                    f"{r['words_per_node']:.0f} | {kept} | {cells} |")
    return "\n".join(rows)


def compare_table(records, scores, cells: list[str], against: str, metric: str, n: int) -> str:
    from memforest_gpu.evaluation.bootstrap import cluster_bootstrap, cluster_weights

    v0, f0 = against.split(":", 1)
    shapes = list(dict.fromkeys(r["shape"] for r in records))
    ratios = sorted({r["ratio"] for r in records})
    rows = [f"| shape | ratio | {against} | " + " | ".join(cells) + " |", "|" + " --- |" * (3 + len(cells))]
    for shape in shapes:
        tenants = scores[f"{shape}|tenants"]
        cats = scores[f"{shape}|categories"]
        base = scores[f"{shape}|none|0|plain|{metric}"]
        _, codes = np.unique(tenants, return_inverse=True)
        w = cluster_weights(codes, n, np.random.default_rng(0))
        groups = [("all", np.ones(len(base), bool))] + [(c, cats == c) for c in sorted(set(cats.tolist()))
                                                        if (cats == c).sum() >= 20 and len(set(cats.tolist())) > 1]
        for ratio in ratios:
            ref_key = f"{shape}|{v0}|{ratio:g}|{f0}|{metric}"
            if ref_key not in scores:
                continue
            ref = scores[ref_key]
            for name, m in groups:
                d = float(np.nanmean(base[m]))
                line = [f"{shape}" + ("" if name == "all" else f" cat. {name}"), f"{ratio:g}",
                        f"{100 * np.nanmean(ref[m]) / d:.1f}"]
                for cell in cells:
                    v, f = cell.split(":", 1)
                    key = f"{shape}|{v}|{ratio:g}|{f}|{metric}"
                    if key not in scores:
                        line.append("-")
                        continue
                    x = scores[key]
                    pt, lo, hi = cluster_bootstrap(x[m], ref[m], tenants[m], weights=w[:, m])
                    star = "*" if lo > 0 or hi < 0 else ""
                    line.append(f"{100 * np.nanmean(x[m]) / d:.1f} ({100 * pt / d:+.1f} [{100 * lo / d:+.1f}, "
                                f"{100 * hi / d:+.1f}]{star})")
                rows.append("| " + " | ".join(line) + " |")
    return "\n".join(rows)


def retention_table(records, scores, cells: list[str], metric: str, n: int, same_fill: bool = False) -> str:
    """Each cell's retention (% of the uncompressed store's mean) with its own 95% cluster bootstrap
    interval: conversations, then questions, resampled; the ratio of the two stores' sums over the
    same draws (questions where both are defined). ``same_fill``: against the uncompressed store
    under the cell's own fill where the run scored it (``focused``, ``pooled``), else the protocol's."""
    from memforest_gpu.evaluation.bootstrap import cluster_weights

    shapes = list(dict.fromkeys(r["shape"] for r in records))
    ratios = sorted({r["ratio"] for r in records})
    rows = ["| shape | ratio | " + " | ".join(cells) + " |", "|" + " --- |" * (2 + len(cells))]
    for shape in shapes:
        tenants = scores[f"{shape}|tenants"]
        base = scores[f"{shape}|none|0|plain|{metric}"]
        _, codes = np.unique(tenants, return_inverse=True)
        w = cluster_weights(codes, n, np.random.default_rng(0))  # (n, Q)
        for ratio in ratios:
            line = [shape, f"{ratio:g}"]
            for cell in cells:
                v, f = cell.split(":", 1)
                key = f"{shape}|{v}|{ratio:g}|{f}|{metric}"
                if key not in scores:
                    line.append("-")
                    continue
                x = scores[key]
                base = scores.get(f"{shape}|none|0|{f}|{metric}") if same_fill else None
                base = scores[f"{shape}|none|0|plain|{metric}"] if base is None else base
                ok = ~(np.isnan(x) | np.isnan(base))
                stats = (w[:, ok] @ x[ok]) / (w[:, ok] @ base[ok])
                lo, hi = np.quantile(stats, [0.025, 0.975])
                line.append(f"{100 * x[ok].sum() / base[ok].sum():.1f} [{100 * lo:.1f}, {100 * hi:.1f}]")
            rows.append("| " + " | ".join(line) + " |")
    return "\n".join(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", required=True, help="OUT folders of long_memories.py, comma-separated")
    p.add_argument("--causes", default="preset:plain", help="VARIANT:FILL cells of the causes table")
    p.add_argument("--compare", default="", help="VARIANT:FILL cells to compare")
    p.add_argument("--against", default="preset:plain")
    p.add_argument("--metric", default="ansr", help="ansr | ansr_content | evr")
    p.add_argument("--retention", default="", help="VARIANT:FILL cells whose retention gets its own interval")
    p.add_argument("--same-fill", action="store_true", help="--retention against the uncompressed store "
                   "under each cell's own fill (where scored)")
    p.add_argument("--bootstrap", type=int, default=2000)
    a = p.parse_args(argv)
    records, scores = load(a.runs.split(","))
    for cell in filter(None, a.causes.split(",")):
        print(f"\n### Lost answers by cause: {cell}\n")
        print(causes_table(records, cell))
    if a.compare:
        print(f"\n### {a.metric}@B retention, minus {a.against} (points, 95% cluster bootstrap)\n")
        print(compare_table(records, scores, a.compare.split(","), a.against, a.metric, a.bootstrap))
    if a.retention:
        print(f"\n### {a.metric}@B retention, % with its 95% cluster bootstrap interval\n")
        print(retention_table(records, scores, a.retention.split(","), a.metric, a.bootstrap, a.same_fill))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
    sys.exit(main())
