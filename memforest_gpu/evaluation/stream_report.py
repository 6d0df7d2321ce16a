"""Outputs of ``memforest eval --stream``: the standard ones (:func:`~.result_files.write_outputs`,
with ``offline-memforest`` as the bootstrap reference) plus ``stream.json`` (every step's
work) and ``stream.md`` (retention per budget, the gap to the offline compress with its
cluster-bootstrap interval, and the work against re-running compress every session)."""
from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict

import torch

from ..config import ConfigError
from ..mergers import get_merger
from ..mergers.embedders import SentenceTransformerEmbedder
from ..store.atomic import atomic_write_text
from .benchmark import load_benchmark
from .cache import CachedEmbedder
from .harness import EvalConfig
from .result_files import aggregate, comparisons, write_outputs
from .stream import StreamConfig, run_stream

__all__ = ["stream_markdown", "write_stream_outputs", "run_cli", "work_totals"]


def work_totals(work: list[dict]) -> dict:
    """(method, budget) -> sessions, compacting sessions, merges, wall / embedding / engine seconds,
    merged texts asked for and embedded (the replay's own cache)."""
    tot = defaultdict(lambda: {"steps": 0, "compactions": 0, "merges": 0, "seconds": 0.0, "embed": 0.0, "texts": 0,
                               "embedded": 0})
    for r in work:
        if r["step"] < 0:
            continue
        t = tot[r["method"], r["budget"]]
        t["steps"] += 1
        t["compactions"] += r["merges"] > 0
        t["merges"] += r["merges"]
        t["seconds"] += r["seconds"]
        t["embed"] += r.get("embed_seconds", 0.0)
        t["texts"] += r.get("texts", 0)
        t["embedded"] += r.get("embedded", 0)
    for t in tot.values():
        t["engine"] = t["seconds"] - t["embed"]
    return dict(tot)


def _work_table(work: list[dict]) -> list[str]:
    tot = work_totals(work)
    L = ["| method | budget | sessions | compacting | merges | texts asked | texts embedded | seconds | "
         "of which embedding | engine seconds | stream / full | stream / rerun |",
         "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def vs(t, kind, m, b):
        ref = tot.get((kind + "-" + m.split("-", 1)[1], b))
        if ref is None or not m.startswith("stream-") or ref["seconds"] <= 0:
            return "–"
        return (f"{t['seconds'] / ref['seconds']:.2f}x time, {t['engine'] / max(ref['engine'], 1e-9):.2f}x engine, "
                f"{t['embedded'] / max(ref['embedded'], 1):.2f}x texts embedded, "
                f"{t['merges'] / max(ref['merges'], 1):.2f}x merges")

    for (m, b), t in sorted(tot.items(), key=lambda kv: (-kv[0][1], kv[0][0])):
        L.append(f"| {m} | {100 * b:.0f}% | {t['steps']} | {t['compactions']} | {t['merges']} | {t['texts']} | "
                 f"{t['embedded']} | {t['seconds']:.1f} | {t['embed']:.1f} | {t['engine']:.1f} | "
                 f"{vs(t, 'full', m, b)} | {vs(t, 'rerun', m, b)} |")
    return L


def stream_markdown(res, work: list[dict], comp: list[dict], reference: str) -> str:
    agg = aggregate(res.records)
    meta = res.meta
    budgets = [round(1 - r, 6) for r in meta["ratios"]]
    labels = meta["methods"]
    L = [f"# Streaming replay: {meta.get('benchmark')}", "",
         f"{meta.get('nodes')} nodes in {meta.get('tenants')} tenants, {meta.get('questions')} questions, replayed in "
         f"{meta.get('steps')} steps (every tenant's k-th session at step k); after each step every tenant over its "
         f"budget is compacted to floor({meta.get('low_water')} x budget); questions asked at the end. Merger "
         f"{meta.get('merger')}, embedder {meta.get('embedder')}, seeds {meta.get('seeds')}. Retention in % of the "
         f"uncompressed final store (plain top-k): AnsR@B / AnsR-c@B.", "",
         "| method | " + " | ".join(f"budget {100 * b:.0f}%" for b in budgets) + " |",
         "|---|" + "---|" * len(budgets)]
    for lab in labels:
        cells = []
        for b in budgets:
            r = round(1 - b, 6)
            a = agg.get((lab, r, "plain", "B", "ansr_retention", "all"))
            c = agg.get((lab, r, "plain", "B", "ansr_content_retention", "all"))
            cells.append("–" if a is None else f"{100 * a[0]:.1f} / {100 * c[0]:.1f}")
        L.append(f"| {lab} | " + " | ".join(cells) + " |")
    L += ["", f"Differences from {reference} (retention points, 95% cluster bootstrap over conversations, then "
              "questions; plain top-k):", "", "| method | budget | Δ AnsR@B | Δ AnsR-c@B |", "|---|---|---|---|"]
    by = defaultdict(dict)
    for r in comp:
        if r["retriever"] != "plain" or r["cut"] != "B":
            continue
        lab = r["method"] if r["schedule"] == "-" else f"{r['method']}:{r['schedule']}"
        by[lab, r["ratio"]][r["metric"]] = r["value"]
    for (lab, ratio), d in by.items():
        cells = []
        for m in ("ansr", "ansr_content"):
            k = f"{m}_retention_diff_vs_{reference}"
            cells.append(f"{d[k]:+.1f} [{d[k + '_ci_lo']:+.1f}, {d[k + '_ci_hi']:+.1f}]" if k in d else "–")
        L.append(f"| {lab} | {100 * (1 - ratio):.0f}% | " + " | ".join(cells) + " |")
    L += ["", "Work: wall seconds of all the replay's compactions; embedding = the time in the embedder (merged texts, "
              "embedded by the model through a cache of the replay's own: a text the replay embedded at an earlier "
              "session is reused, nothing comes from another replay or an earlier run); texts asked = merged texts "
              "the engine asked for (what an embedder without a cache embeds), texts embedded = those the model "
              "embedded; engine = the rest (placement, partition, trees, planning, merging, splicing). "
              "full = compress of the whole current "
              "store after every session; rerun = compress of every memory so far, uncompressed, after every "
              "session.", ""] + _work_table(work)
    return "\n".join(L) + "\n"


def write_stream_outputs(res, work, out_dir: str, *, bootstrap: int, reference: str) -> dict:
    paths = write_outputs(res, out_dir, bootstrap=bootstrap, reference=reference)
    comp = comparisons(res, n=bootstrap, reference=reference)
    paths["stream_json"] = os.path.join(out_dir, "stream.json")
    paths["stream_md"] = os.path.join(out_dir, "stream.md")
    atomic_write_text(paths["stream_json"], json.dumps({"meta": res.meta, "work": work}, indent=1))
    atomic_write_text(paths["stream_md"], stream_markdown(res, work, comp, reference))
    return paths


def run_cli(a, config, methods: list[str]) -> int:
    """``memforest eval --stream`` from parsed arguments."""

    budgets = tuple(float(x) for x in a.budgets.split(",") if x.strip())
    for b in budgets:
        if not 0 < b < 1:
            raise ConfigError("budgets", f"must be fractions in (0, 1), got {b!r}")  # the command names its flag
    scfg = StreamConfig(budgets=budgets, low_water=a.low_water, full_reference=not a.no_full_reference,
                        rerun=a.rerun)

    bench = load_benchmark(a.benchmark)
    emb = CachedEmbedder(SentenceTransformerEmbedder(None if a.embedder == "default" else a.embedder, device=a.device,
                                                     cache=False),  # each replay caches its own (stream._Timed)
                         a.cache or os.path.join(a.out, ".cache"))
    if a.threads:
        torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    say = None if a.quiet else (lambda line: print(f"[{time.perf_counter() - t0:.0f}s] {line}", file=sys.stderr,
                                                   flush=True))
    seeds = [int(x) for x in a.seeds.split(",") if x.strip()]
    res, work = run_stream(bench, methods, scfg, seeds, embedder=emb, merger=get_merger(a.merger), base_config=config,
                           eval_config=EvalConfig(k=a.k, max_tokens=a.max_tokens, L=a.L, lam=a.lam, gamma=a.gamma),
                           device=a.device, progress=say)
    emb.flush()
    mf = next((m for m in methods if m.startswith("memforest")), methods[0])
    reference = a.reference or f"offline-{mf}"
    paths = write_stream_outputs(res, work, a.out, bootstrap=a.bootstrap, reference=reference)
    print(f"streaming replay of {len(methods)} methods x {len(budgets)} budgets in {time.perf_counter() - t0:.0f}s")
    print("\n".join(f"wrote {p}" for p in paths.values()))
    return 0
