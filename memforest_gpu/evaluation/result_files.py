"""Outputs of an evaluation: ``results.json``, ``per_question.npz``, ``results.md`` and
``retention.png``.

Means are over seeds; the spread (``±``) is the standard deviation over seeds. A method's
difference from the reference (MemForest) is a cluster bootstrap (:func:`cluster_bootstrap`):
conversations (tenants) are resampled, then questions inside each drawn conversation, and
each method's seeds too, so neither the clustering of questions nor the seed spread is
ignored. In retention points; a difference is *called* (▼ / ▲) only when its 95% interval
excludes zero. :func:`paired_bootstrap` (questions only) is kept for reference.
"""
from __future__ import annotations

import json
import os
from collections import defaultdict

import numpy as np

from ..store.atomic import atomic_open, atomic_write_text
from .bootstrap import cluster_bootstrap, cluster_weights, paired_bootstrap
from .harness import EvalResult, cell_key
from .qa_report import cat_label, qa_section

__all__ = ["aggregate", "paired_bootstrap", "cluster_bootstrap", "comparisons", "markdown", "plot",
           "write_outputs", "load_result", "REFERENCE"]

REFERENCE = "memforest:sequential"
_BOOT_METRICS = (("B", "ansr"), ("B", "ansr_content"), ("k", "evr"), ("B", "evr"))
QA_BOOT_METRICS = (("k", "j"), ("k", "f1"))  # the LLM protocol's, when the run has them
_DIFF = "_retention_diff_vs_"


def _label(rec) -> str:
    return rec["method"] if rec["schedule"] in ("-", None) else f"{rec['method']}:{rec['schedule']}"


def aggregate(records: list[dict]) -> dict[tuple, tuple[float, float, int]]:
    """{(label, ratio, retriever, cut, metric, category): (mean, std, n_seeds)} over seeds."""
    groups = defaultdict(list)
    for r in records:
        if r.get("seed") == "mean" or r["value"] is None:
            continue
        groups[_label(r), r["ratio"], r["retriever"], r["cut"], r["metric"], r["category"]].append(r["value"])
    out = {}
    for k, v in groups.items():
        a = np.asarray(v, dtype=np.float64)
        out[k] = (float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0, len(a))
    return out


def _seed_rows(res: EvalResult, label: str, ratio: float, retriever: str, cut: str, metric: str):
    """(S, Q) per-seed scores of a cell, or None; questions of the categories reported apart
    (abstention) are NaN, so no comparison counts them."""
    seeds = res.meta.get("seeds", [0])
    rows = [res.per_question[k] for sd in seeds
            if (k := cell_key(label, ratio, sd, retriever, cut, metric)) in res.per_question]
    if not rows:
        return None
    out = np.stack(rows).astype(np.float64)
    apart = res.meta.get("categories_apart") or []
    if apart:
        out[:, np.isin(np.asarray(res.categories), apart)] = np.nan
    return out


def _clusters(res: EvalResult) -> tuple[np.ndarray, bool]:
    """Question -> cluster code (its tenant); one cluster per question when the result
    records no tenants (then the bootstrap is over questions). Returns (codes, by_tenant)."""
    ten = res.question_tenants
    if ten is None or len(ten) != len(res.question_ids):
        return np.arange(len(res.question_ids)), False
    return np.unique(np.asarray(ten), return_inverse=True)[1], True


def _n_clusters(res: EvalResult) -> int:
    return len(set(res.question_tenants or []))


def comparisons(res: EvalResult, *, reference: str = REFERENCE, n: int = 2000) -> list[dict]:
    """Every method's difference from ``reference`` at each ratio and retriever, in
    retention points (x100), for AnsR@B, AnsR-content@B, EvR@k and EvR@B (and the LLM
    protocol's J@k and F1@k when the run has them), with a cluster bootstrap interval
    (:func:`cluster_bootstrap`, tenants as clusters). Flat records."""
    denom = {}
    for r in res.records:
        if r["method"] == "none" and r["retriever"] == "plain" and r["category"] == "all":
            denom[r["cut"], r["metric"]] = r["value"]
    labels = res.meta.get("methods", [])
    if reference not in labels:
        return []
    codes, _ = _clusters(res)
    weights = cluster_weights(codes, n, np.random.default_rng(0))  # common to every comparison
    out = []
    for ratio in res.meta.get("ratios", []):
        for retriever in ("plain", "agpr"):
            for cut, metric in _BOOT_METRICS + QA_BOOT_METRICS:
                ref = _seed_rows(res, reference, ratio, retriever, cut, metric)
                d = denom.get((cut, metric))
                if ref is None or not d:
                    continue
                for label in labels:
                    if label == reference:
                        continue
                    x = _seed_rows(res, label, ratio, retriever, cut, metric)
                    if x is None:
                        continue
                    m, lo, hi = (100 * v / d for v in cluster_bootstrap(x, ref, codes, weights=weights, seed=1))
                    call = "n.s." if lo <= 0 <= hi else ("worse" if hi < 0 else "better")
                    method, _, schedule = label.partition(":")
                    base = {"benchmark": res.meta.get("benchmark"), "method": method, "schedule": schedule or "-",
                            "ratio": ratio, "seed": "mean", "retriever": retriever, "cut": cut, "category": "all"}
                    metric_name = f"{metric}{_DIFF}{reference}"
                    calls = {"n.s.": 0, "worse": -1, "better": 1}
                    out += [{**base, "metric": metric_name + suffix, "value": v} for suffix, v in
                            (("", m), ("_ci_lo", lo), ("_ci_hi", hi), ("_call", calls[call]))]
    return out


# ------------------------------------------------------------------ tables
def _pm(agg, key, scale=100.0, digits=1) -> str:
    v = agg.get(key)
    if v is None:
        return "–"
    m, s, n = v
    return f"{scale * m:.{digits}f}" + (f" ± {scale * s:.{digits}f}" if n > 1 else "")


def _plain(agg, key, scale=100.0, digits=1) -> str:
    v = agg.get(key)
    return "–" if v is None else f"{scale * v[0]:.{digits}f}"


def _calls(comp: list[dict], reference: str) -> dict:
    out = {}
    for r in comp:
        if r["metric"].endswith("_call"):
            label = r["method"] if r["schedule"] == "-" else f"{r['method']}:{r['schedule']}"
            metric = r["metric"].split(_DIFF)[0]
            out[label, r["ratio"], r["retriever"], r["cut"], metric] = {0: "n.s.", -1: "worse", 1: "better"}[r["value"]]
    return out


def markdown(res: EvalResult, comp: list[dict] | None = None, *, reference: str = REFERENCE) -> str:
    """The results in the paper's layout (methods as rows, one block per ratio, with each store's
    vector rows per memory, bytes against the uncompressed store in the same encoding and the
    AnsR@B points lost to condensing), then a retention summary, AGPR, the bootstrap calls and
    the search speedups."""
    agg = aggregate(res.records)
    meta = res.meta
    apart = res.meta.get("categories_apart") or []  # abstention: last, never in "all"
    cats = sorted(set(res.categories), key=lambda c: (c in apart, len(c), c))
    labels = meta.get("methods", [])
    ratios = meta.get("ratios", [])
    ev = meta.get("eval", {})
    k, B = ev.get("k", 10), ev.get("budget", 256)
    comp = comp if comp is not None else []
    calls = _calls(comp, reference)
    L = []
    L.append(f"# Evaluation: {meta.get('benchmark')}")
    L.append("")
    L.append(f"{meta.get('nodes')} nodes in {meta.get('tenants')} tenants, {meta.get('questions')} questions "
             f"(categories {', '.join(f'{c}: {n}' for c, n in meta.get('categories', {}).items())}). "
             f"Merger: **{meta.get('merger')}** ({meta.get('merger_kind')}); embedder {meta.get('embedder')}; "
             f"seeds {meta.get('seeds')}; @k = top {k} nodes, @B = {B} whitespace tokens"
             + (" of the search's context (--fill ranked: the parts of merged nodes that matched first). "
                if ev.get("fill") == "ranked" else ". ")
             + "Values are x100, mean ± std over seeds; % = retention against the uncompressed store "
             "with plain top-k. AnsR-c (AnsR-content) credits answer tokens only from node text and from "
             "the dates of nodes that hold the question's evidence, not from unrelated nodes' date headers. "
             "rows: vector rows searched per memory; bytes %: texts and vectors against the uncompressed store "
             "in the same encoding; cond.: AnsR@B points (of the uncompressed mean, plain top-k) lost to "
             "condensing, answer words of an evidence memory that its merged node no longer holds."
             + _evidence_counts(meta)
             + (f" Categories {', '.join(meta['categories_apart'])} (abstention questions) are reported apart: "
                f"not in 'all'." if meta.get("categories_apart") else "")
             + (f" {meta['multiple_choice']} multiple-choice questions: AnsR counts the correct option's distinctive "
                f"tokens (those no other option has)." if meta.get("multiple_choice") else "")
             + (f" **{meta['questions_skipped_missing_context']} questions skipped** (--skip-missing-contexts): their "
                f"shared_context_id is one of {meta.get('contexts_missing')} contexts the contexts file lacks."
                if meta.get("questions_skipped_missing_context") else ""))
    L.append("")
    head = (["Method"] + [f"AnsR@B {cat_label(c)}" for c in cats]
            + ["AnsR@B all", "%", "AnsR-c@B all", "%", f"EvR@{k}", "%", "EvR@B", "%", f"Ctx@{k}", "Dates@B", "speedup",
               "rows", "bytes %", "cond."])
    L.append("| " + " | ".join(head) + " |")
    L.append("|" + "---|" * len(head))

    def row(name, label, ratio, retriever):
        key = (label, ratio, retriever)
        cells = [_plain(agg, (*key, "B", "ansr", c)) for c in cats]
        cells += [_pm(agg, (*key, "B", "ansr", "all")), _pm(agg, (*key, "B", "ansr_retention", "all")),
                  _pm(agg, (*key, "B", "ansr_content", "all")), _pm(agg, (*key, "B", "ansr_content_retention", "all")),
                  _pm(agg, (*key, "k", "evr", "all")), _pm(agg, (*key, "k", "evr_retention", "all")),
                  _pm(agg, (*key, "B", "evr", "all")), _pm(agg, (*key, "B", "evr_retention", "all")),
                  _plain(agg, (*key, "k", "ctx", "all"), scale=1, digits=0),
                  _plain(agg, (*key, "B", "dates", "all"), scale=1, digits=1),
                  "–" if label == "none" else _plain(agg, (*key, "-", "search_speedup", "all"), scale=1, digits=2),
                  _plain(agg, (label, ratio, "-", "-", "rows_share", "all"), scale=1, digits=2),
                  _plain(agg, (label, ratio, "-", "-", "bytes_share", "all"), scale=100, digits=0),
                  _plain(agg, (label, ratio, "plain", "B", "condensed_points", "all"), scale=100, digits=1)]
        L.append(f"| {name} | " + " | ".join(cells) + " |")

    row("uncompressed", "none", 0.0, "plain")
    row("+ AGPR", "none", 0.0, "agpr")
    for ratio in ratios:
        L.append(f"| **ratio {ratio:g} (↓{100 * ratio:.0f}%)** |" + " |" * (len(head) - 1))
        for label in labels:
            row(f"+ {label}", label, ratio, "plain")
        for label in labels:
            if label.startswith("memforest"):
                row(f"+ {label} + AGPR", label, ratio, "agpr")
    L.append("")
    by_tenant = _n_clusters(res) if _clusters(res)[1] else 0
    L.append(_summary(agg, labels, ratios, calls, "plain", k, reference, by_tenant))
    L.append("")
    L.append("### With AGPR")
    L.append("")
    L.append(_summary(agg, labels, ratios, calls, "agpr", k, reference, by_tenant))
    if comp:
        L += [""] + _differences(res, comp, reference, k)
    L += qa_section(meta, agg, comp, cats, reference)
    return "\n".join(L) + "\n"


def _differences(res: EvalResult, comp: list[dict], reference: str, k: int) -> list[str]:
    """The bootstrap table: each method's difference from ``reference`` per ratio and retriever."""
    how = (f"cluster bootstrap: {_n_clusters(res)} conversations, questions inside them, seeds resampled"
           if _clusters(res)[1] else "bootstrap over questions (no tenants recorded), seeds resampled")
    L = [f"### Differences from {reference} (retention points, 95% interval; {how})", "",
         f"| method | ratio | retriever | Δ AnsR@B | call | Δ AnsR-c@B | call | Δ EvR@{k} | call | Δ EvR@B | call |",
         "|---|---|---|---|---|---|---|---|---|---|---|"]
    by = defaultdict(dict)
    for r in comp:
        label = r["method"] if r["schedule"] == "-" else f"{r['method']}:{r['schedule']}"
        by[label, r["ratio"], r["retriever"]][r["cut"], r["metric"]] = r["value"]
    for (label, ratio, retriever), d in by.items():
        cells = []
        for cut, metric in _BOOT_METRICS:
            base = f"{metric}{_DIFF}{reference}"
            d_cut = {m: v for (c, m), v in d.items() if c == cut}
            if base not in d_cut:
                cells += ["–", "–"]
                continue
            cells.append(f"{d_cut[base]:+.1f} [{d_cut[base + '_ci_lo']:+.1f}, {d_cut[base + '_ci_hi']:+.1f}]")
            cells.append({0: "n.s.", -1: "reference ahead", 1: "reference behind"}[d_cut[base + "_call"]])
        L.append(f"| {label} | {ratio:g} | {retriever} | " + " | ".join(cells) + " |")
    return L


def _evidence_counts(meta: dict) -> str:
    """The benchmark's questions without an evidence node, when the loader counted them."""
    n = meta.get("questions_without_evidence")
    if not n:
        return ""
    uncited = meta.get("questions_evidence_uncited")
    why = f" ({uncited} whose evidence turns no fact cites)" if uncited else ""
    return (f" {n} questions have no evidence node{why}: they count for AnsR and AnsR-c, not for EvR"
            + (f"; {meta['evidence_turns_uncited']} evidence turn ids are cited by no fact."
               if "evidence_turns_uncited" in meta else "."))


def _summary(agg, labels, ratios, calls, retriever, k, reference=REFERENCE, by_tenant: int = 0) -> str:
    """Method rows, per ratio 'AnsR@B % / AnsR-c@B % / EvR@k %' (the README table)."""
    L = ["| method | " + " | ".join(f"ratio {r:g}: AnsR@B % / AnsR-c@B % / EvR@{k} %" for r in ratios) + " |",
         "|---|" + "---|" * len(ratios)]

    def mark(label, r, cut, metric):
        return {"worse": "▼", "better": "▲"}.get(calls.get((label, r, retriever, cut, metric)), "")

    for label in labels:
        cells = []
        for r in ratios:
            a = _pm(agg, (label, r, retriever, "B", "ansr_retention", "all"))
            c = _pm(agg, (label, r, retriever, "B", "ansr_content_retention", "all"))
            e = _pm(agg, (label, r, retriever, "k", "evr_retention", "all"))
            cells.append(f"{a}{mark(label, r, 'B', 'ansr')} / {c}{mark(label, r, 'B', 'ansr_content')} / "
                         f"{e}{mark(label, r, 'k', 'evr')}")
        L.append(f"| {label} | " + " | ".join(cells) + " |")
    L.append("")
    how = (f"cluster bootstrap over conversations (tenants; {by_tenant} here), then questions inside them, "
           "with each method's seeds resampled" if by_tenant else "bootstrap over questions (no tenants "
           "recorded), with each method's seeds resampled")
    L.append(f"▼ / ▲: below / above {reference} beyond the noise ({how}; 95% interval excludes zero); "
             f"no mark: not distinguishable.")
    return "\n".join(L)


# ------------------------------------------------------------------ plot
def plot(res: EvalResult, path: str, *, retriever: str = "plain") -> bool:
    """Retention (AnsR@B and EvR@k) against ratio, one line per method. Returns False
    (and writes nothing) when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    agg = aggregate(res.records)
    ratios = res.meta.get("ratios", [])
    k = res.meta.get("eval", {}).get("k", 10)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, (cut, metric, title) in zip(axes, (("B", "ansr_retention", "AnsR@B retention (%)"),
                                               ("k", "evr_retention", f"EvR@{k} retention (%)"))):
        for label in res.meta.get("methods", []):
            xs, ys, es = [0.0], [100.0], [0.0]
            for r in ratios:
                v = agg.get((label, r, retriever, cut, metric, "all"))
                if v is not None:
                    xs.append(r)
                    ys.append(100 * v[0])
                    es.append(100 * v[1])
            style = "-" if label.startswith("memforest") else "--"
            lw = 2.4 if label == res.meta.get("reference", REFERENCE) else 1.3
            ax.errorbar(xs, ys, yerr=es, label=label, linestyle=style, linewidth=lw, marker="o", markersize=3,
                        capsize=2)
        ax.set_xlabel("compression ratio (fraction of nodes removed)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="lower left")
    fig.suptitle(f"{res.meta.get('benchmark')}: merger {res.meta.get('merger')}, {retriever} top-k, "
                 f"mean ± std over seeds {res.meta.get('seeds')}", fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with atomic_open(path) as f:
        fig.savefig(f, format="png", dpi=120)
    plt.close(fig)
    return True


# ------------------------------------------------------------------ files
def write_outputs(res: EvalResult, out_dir: str, *, bootstrap: int = 2000, reference: str | None = None) -> dict:
    """Write every output; returns their paths. ``reference``: the method every other one
    is compared with (default: the run's, else ``memforest:sequential``)."""
    os.makedirs(out_dir, exist_ok=True)
    reference = reference or res.meta.get("reference") or REFERENCE
    res.meta["reference"] = reference
    comp = comparisons(res, n=bootstrap, reference=reference)
    paths = {"json": os.path.join(out_dir, "results.json"), "npz": os.path.join(out_dir, "per_question.npz"),
             "md": os.path.join(out_dir, "results.md"), "png": os.path.join(out_dir, "retention.png")}
    atomic_write_text(paths["json"], json.dumps({"meta": res.meta, "records": res.records + comp}, indent=1))
    with atomic_open(paths["npz"]) as f:
        extra = {} if res.question_tenants is None else {"question_tenants": np.array(res.question_tenants)}
        np.savez_compressed(f, question_ids=np.array(res.question_ids), categories=np.array(res.categories),
                            **extra, **{k: v for k, v in res.per_question.items()})
    atomic_write_text(paths["md"], markdown(res, comp, reference=reference))
    if not plot(res, paths["png"]):
        paths.pop("png")
    return paths


def load_result(out_dir: str) -> EvalResult:
    """Read back ``results.json`` + ``per_question.npz`` (to redo tables and plot)."""
    with open(os.path.join(out_dir, "results.json"), encoding="utf-8") as f:
        data = json.load(f)
    recs = [r for r in data["records"] if r.get("seed") != "mean"]
    with np.load(os.path.join(out_dir, "per_question.npz")) as z:
        pq = {k: z[k] for k in z.files if k not in ("question_ids", "categories", "question_tenants")}
        qids = z["question_ids"].tolist()
        cats = z["categories"].tolist()
        tenants = z["question_tenants"].tolist() if "question_tenants" in z.files else None
    return EvalResult(recs, pq, qids, cats, data["meta"], tenants)
