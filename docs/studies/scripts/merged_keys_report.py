"""The analysis of ``docs/studies/scripts/merged_keys.py``'s scores: retention per rule, the cluster bootstrap
against today's rule, the text weight (and the whole rule) chosen by leave-one-conversation-out,
the baselines under the same rule, and the storage of each rule.

    python docs/studies/scripts/merged_keys_report.py --out OUT [--bootstrap 2000]

Retention = the mean score over a set of questions / the uncompressed store's mean over the
same questions (plain top-k). Differences are in retention points (x100) with the protocol's
cluster bootstrap (conversations, then questions; ``memforest_gpu.evaluation.result_files``).
Selection metric of every leave-one-out here (fixed before the runs): the mean over ratios and
over both shapes of the AnsR-c@B retention on the four training conversations. Writes
``OUT/report.md`` and ``OUT/report.json``.
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np

from memforest_gpu.evaluation.bootstrap import cluster_bootstrap, cluster_weights

SELECT = "B|ansr_content"


class Scores:
    """Per-question scores of the study, by (shape, method, ratio, rule, metric)."""

    def __init__(self, out: str, n_boot: int):
        with np.load(os.path.join(out, "scores.npz")) as z:
            self.z = {k: z[k] for k in z.files}
        self.storage = json.load(open(os.path.join(out, "storage.json")))
        self.q = json.load(open(os.path.join(out, "questions.json")))
        self.shapes = list(self.q)
        self.tenants = {s: np.asarray(self.q[s]["tenants"]) for s in self.shapes}
        self.convs = sorted(set(self.tenants[self.shapes[0]].tolist()))
        self.codes = {s: np.unique(self.tenants[s], return_inverse=True)[1] for s in self.shapes}
        rng = np.random.default_rng(0)
        self.weights = {s: cluster_weights(self.codes[s], n_boot, rng) for s in self.shapes}

    def get(self, shape, method, ratio, rule, metric, retriever="plain", seed=0) -> np.ndarray:
        if method == "none":
            return self.z[f"{shape}|none|0|0|text|{retriever}|{metric}"].astype(np.float64)
        key = f"{shape}|{method}|{ratio:g}|{seed}|{rule}|{retriever}|{metric}"
        if key not in self.z:  # a method without merges scores the same under every rule
            key = f"{shape}|{method}|{ratio:g}|{seed}|text|{retriever}|{metric}"
        return self.z[key].astype(np.float64)

    def retention(self, shape, x: np.ndarray, metric, mask=None) -> float:
        base = self.get(shape, "none", 0, "text", metric)
        m = np.ones(len(x), bool) if mask is None else mask
        ok = m & ~np.isnan(x) & ~np.isnan(base)
        return float(np.nanmean(x[m]) / np.nanmean(base[ok])) if ok.any() else float("nan")

    def boot(self, shape, a: np.ndarray, b: np.ndarray, metric) -> tuple[float, float, float]:
        d = np.nanmean(self.get(shape, "none", 0, "text", metric))
        m, lo, hi = cluster_bootstrap(a, b, self.codes[shape], weights=self.weights[shape], seed=1)
        return 100 * m / d, 100 * lo / d, 100 * hi / d


def fmt_ci(t) -> str:
    m, lo, hi = t
    star = "*" if lo > 0 or hi < 0 else ""
    return f"{m:+.1f} [{lo:+.1f}, {hi:+.1f}]{star}"


def loo(S: Scores, cands: list[tuple[str, str]], ratios) -> dict:
    """Leave-one-conversation-out over ``cands`` ((method, rule) pairs): per fold the candidate
    with the best selection score on the other conversations, and the procedure's held-out
    per-question scores (each conversation scored by its fold's choice)."""
    folds, held = [], {}
    for conv in S.convs:
        train = {s: S.tenants[s] != conv for s in S.shapes}

        def score(c):
            return np.mean([S.retention(s, S.get(s, c[0], r, c[1], SELECT), SELECT, train[s])
                            for s in S.shapes for r in ratios])

        sc = [score(c) for c in cands]
        best = int(np.argmax(sc))  # ties to the earlier candidate
        folds.append({"held_out": conv, "chosen": list(cands[best]), "train_score": sc[best]})
    for s in S.shapes:
        for r in ratios:
            for metric in ("B|ansr", "B|ansr_content", "B|evr"):
                x = np.full(len(S.tenants[s]), np.nan)
                for f in folds:
                    m = S.tenants[s] == f["held_out"]
                    x[m] = S.get(s, f["chosen"][0], r, f["chosen"][1], metric)[m]
                held[s, r, metric] = x
    return {"folds": folds, "held": held}


def storage_rows(S: Scores, method: str, bounds) -> list[str]:
    """Vectors per node and bytes (text + vectors + keys) against the uncompressed store."""
    st = S.storage["stores"]
    L = ["| shape | ratio | nodes | merged | text bytes | " + " | ".join(
        f"{b}: vectors/node, store %" for b in ("text", *bounds)) + " |", "|---" * (5 + 1 + len(bounds)) + "|"]
    for s in S.shapes:
        base = st[f"{s}|none"]
        total0 = base["text_bytes"] + base["vector_bytes"]
        for r in sorted({float(k.split("|")[2]) for k in st if k.startswith(f"{s}|{method}|")}):
            rec = st[f"{s}|{method}|{r:g}|0"]
            cells = [f"1.00, {100 * (rec['text_bytes'] + rec['vector_bytes']) / total0:.0f}%"]
            for b in bounds:
                k = rec.get(f"keys_{b}")
                if k is None:
                    cells.append("–")
                    continue
                v = (rec["nodes"] + k["keys"]) / rec["nodes"]
                size = rec["text_bytes"] + rec["vector_bytes"] + k["key_bytes"]
                cells.append(f"{v:.2f}, {100 * size / total0:.0f}%")
            L.append(f"| {s} | {r:g} | {rec['nodes']} | {rec['merged_nodes']} | {rec['text_bytes']:,} | "
                     + " | ".join(cells) + " |")
    return L


def rule_table(S: Scores, shape: str, method: str, rules, ratios) -> list[str]:
    """Per rule: AnsR@B retention and its difference from today's rule (bootstrap) per ratio;
    AnsR-c@B and EvR@B retention beside."""
    L = ["| rule | " + " | ".join(f"{r:g}: AnsR@B (vs text)" for r in ratios) + " | AnsR-c@B | EvR@B |",
         "|---" * (3 + len(ratios)) + "|"]
    for rule in rules:
        cells, cc, ev = [], [], []
        for r in ratios:
            x = S.get(shape, method, r, rule, "B|ansr")
            t = S.get(shape, method, r, "text", "B|ansr")
            ret = 100 * S.retention(shape, x, "B|ansr")
            cells.append(f"{ret:.1f}" + ("" if rule == "text" else f" ({fmt_ci(S.boot(shape, x, t, 'B|ansr'))})"))
            for acc, metric in ((cc, "B|ansr_content"), (ev, "B|evr")):
                acc.append(f"{100 * S.retention(shape, S.get(shape, method, r, rule, metric), metric):.1f}")
        L.append(f"| {rule} | " + " | ".join(cells) + f" | {' / '.join(cc)} | {' / '.join(ev)} |")
    return L


def loo_rows(S: Scores, res: dict, ratios, today: tuple[str, str]) -> list[str]:
    """Per fold the choice, then the pooled held-out retention per shape and ratio against today's."""
    L = ["| held out | chosen on the other 4 | train score |", "|---|---|---|"]
    L += [f"| {f['held_out']} | {' '.join(f['chosen'])} | {100 * f['train_score']:.1f} |" for f in res["folds"]]
    L += ["", "| shape | ratio | AnsR@B held out | vs today | AnsR-c@B held out | vs today |", "|---" * 6 + "|"]
    for s in S.shapes:
        for r in ratios:
            row = [s, f"{r:g}"]
            for metric in ("B|ansr", "B|ansr_content"):
                x = res["held"][s, r, metric]
                row += [f"{100 * S.retention(s, x, metric):.1f}",
                        fmt_ci(S.boot(s, x, S.get(s, today[0], r, today[1], metric), metric))]
            L.append("| " + " | ".join(row) + " |")
    return L


def baseline_rows(S: Scores, mine: tuple[str, str], baselines, ratios) -> list[str]:
    """MemForest under ``mine`` minus each baseline under the same rule (AnsR@B, AnsR-c@B)."""
    L = ["| shape | ratio | baseline | its AnsR@B (text / same rule) | ours minus it, AnsR@B | AnsR-c@B |",
         "|---" * 6 + "|"]
    for s in S.shapes:
        for r in ratios:
            for b in baselines:
                xb = S.get(s, b, r, mine[1], "B|ansr")
                t = 100 * S.retention(s, S.get(s, b, r, "text", "B|ansr"), "B|ansr")
                row = [s, f"{r:g}", b, f"{t:.1f} / {100 * S.retention(s, xb, 'B|ansr'):.1f}"]
                for metric in ("B|ansr", "B|ansr_content"):
                    ours, theirs = S.get(s, mine[0], r, mine[1], metric), S.get(s, b, r, mine[1], metric)
                    row.append(fmt_ci(S.boot(s, ours, theirs, metric)))
                L.append("| " + " | ".join(row) + " |")
    return L


def study_name(candidate: str) -> tuple[str, str]:
    """A ``memforest eval --leave-one-out`` candidate name -> (method, rule) of the study:
    ``"sequential a=0.001 ... keys=all:0.5"`` -> ``("memforest:sequential", "kall/w0.5")``."""
    schedule = candidate.split()[0]
    _, _, rule = candidate.partition(" keys=")
    if not rule:
        return f"memforest:{schedule}", "text"
    k, _, w = rule.partition(":")
    return f"memforest:{schedule}", f"k{k}/w{float(w or 0):g}"


def procedure_rows(S: Scores, loo_json: str, ratios, baselines) -> list[str]:
    """The held-out scores of the procedure ``memforest eval --leave-one-out`` ran (each
    conversation by its fold's choice, read from its loo.json), pooled over each shape's
    questions, against today's rule and every baseline under the chosen rule."""
    folds = json.load(open(loo_json))["folds"]
    res = {"folds": [{"held_out": f["held_out"], "chosen": list(study_name(f["chosen"])),
                      "train_score": f["train_score"]} for f in folds], "held": {}}
    for s in S.shapes:
        for r in ratios:
            for metric in ("B|ansr", "B|ansr_content", "B|evr"):
                x = np.full(len(S.tenants[s]), np.nan)
                for f in res["folds"]:
                    m = S.tenants[s] == f["held_out"]
                    x[m] = S.get(s, f["chosen"][0], r, f["chosen"][1], metric)[m]
                res["held"][s, r, metric] = x
    L = loo_rows(S, res, ratios, ("memforest:matching", "text"))
    L += ["", "| shape | ratio | baseline (under its fold's rule) | procedure minus it, AnsR@B | AnsR-c@B |",
          "|---" * 5 + "|"]
    for s in S.shapes:
        for r in ratios:
            for b in baselines:
                row = [s, f"{r:g}", b]
                for metric in ("B|ansr", "B|ansr_content"):
                    y = np.full(len(S.tenants[s]), np.nan)
                    for f in res["folds"]:
                        m = S.tenants[s] == f["held_out"]
                        y[m] = S.get(s, b, r, f["chosen"][1], metric)[m]
                    row.append(fmt_ci(S.boot(s, res["held"][s, r, metric], y, metric)))
                L.append("| " + " | ".join(row) + " |")
    return L


def write_report(S: Scores, out: str, rule: str | None, ratios=(0.3, 0.5, 0.7), loo_json: str | None = None) -> None:
    rules = S.storage["rules"]
    methods = sorted({k.split("|")[1] for k in S.storage["stores"] if "|none" not in k})
    mf = "memforest:matching"
    L = ["# How a merged node is found: the study", ""]
    for s in S.shapes:
        L += [f"## {s}: every rule on the preset's stores ({mf})", ""] + rule_table(S, s, mf, rules, ratios) + [""]
    bounds = sorted({r.split("/")[0][1:] for r in rules if r.startswith("k")}, key=lambda b: (b == "all", b))
    per_bound = {}
    for b in bounds:
        cands = [(mf, r) for r in rules if r.startswith(f"k{b}/")]
        per_bound[b] = loo(S, cands, ratios)
        L += [f"## Text weight for k{b} chosen by leave-one-out ({mf})", ""]
        L += loo_rows(S, per_bound[b], ratios, (mf, "text")) + [""]
    schedules = [m for m in ("memforest:matching", "memforest:sequential") if m in methods]
    joint = loo(S, [(m, r) for m in schedules for r in rules], ratios)
    L += ["## Schedule and rule chosen together by leave-one-out", ""] + loo_rows(S, joint, ratios, (mf, "text"))
    picks = [tuple(f["chosen"]) for f in joint["folds"]]
    mine = max(set(picks), key=picks.count) if rule is None else tuple(rule.split("@"))
    merging = [m for m in methods if m not in ("memforest:matching", "memforest:sequential")]
    L += ["", f"## Baselines under the same rule ({' '.join(mine)})", ""]
    L += baseline_rows(S, mine, merging, ratios)
    if loo_json:
        L += ["", f"## The procedure of {loo_json}, held out", ""] + procedure_rows(S, loo_json, ratios, merging)
    L += ["", "## Storage", ""] + storage_rows(S, mf, bounds)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(L) + "\n")
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump({"joint": joint["folds"], "per_bound": {b: v["folds"] for b, v in per_bound.items()},
                   "chosen": list(mine)}, f, indent=1)
    print("\n".join(L))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--bootstrap", type=int, default=2000)
    ap.add_argument("--rule", default=None, help="METHOD@RULE compared with the baselines (default: the joint "
                                                 "leave-one-out's most chosen)")
    ap.add_argument("--ratios", default="0.3,0.5,0.7")
    ap.add_argument("--loo-json", default=None, help="loo.json of a memforest eval --leave-one-out run over the "
                                                      "same stores: its procedure's held-out scores")
    a = ap.parse_args(argv)
    write_report(Scores(a.out, a.bootstrap), a.out, a.rule, tuple(float(x) for x in a.ratios.split(",")), a.loo_json)


if __name__ == "__main__":
    main()
