"""Where the answer points go at one ratio: a diagnostic of compressed stores on LoCoMo.

For each method (``NAME[:SCHEDULE]`` as in ``memforest eval``; MemForest from ``--preset``
with ``--set stage.field=value`` changes) at ``--ratio``, compress the benchmark, retrieve
with plain top-k and print, against the uncompressed store:

- **per category**: AnsR@B and AnsR-c@B retention (%);
- **lost points**: the AnsR@B points lost (questions that lost minus those that gained, as
  points of the uncompressed mean), split by whether the question's evidence reached the
  @B context less often (EvR@B fell: retrieval or the budget cut) or not (the evidence is
  there as before: the answer's tokens were crowded out or dropped by a merge);
- **the @B budget**: nodes in the context, the share of its tokens in merged nodes, in
  date headers and inline date tags, in nodes holding the question's evidence, and
  originals per node;
- **duplicates inside merged nodes**: the share of a merged node's sources that repeat
  another source of the same node (cosine of the originals' vectors >= ``--dup-cos``), and
  the share of the @B context's tokens that are such repeats (shown verbatim);
- **dates**: distinct dates in the @B context, inline date tags per merged node.

    python docs/studies/scripts/quality_points.py --benchmark ../shared/data/locomo_dev5.json --nodes facts \
        --ratio 0.7 --methods memforest:matching,tome [--set spanning.time_rule=flat] [--cache DIR] [--out points.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "bench"))  # bench/common.py
sys.path.insert(0, HERE)  # the other study scripts

from common import print_hardware, write_records  # noqa: E402


def _config(preset_name: str, sets: list[str]):
    from memforest_gpu.config import preset

    cfg = preset(preset_name)
    for s in sets:
        key, _, value = s.partition("=")
        stage, _, name = key.partition(".")
        stage = {"tree": "spanning"}.get(stage, stage)  # the spanning stage's name before it was renamed
        old = getattr(getattr(cfg, stage), name)
        typed = value if isinstance(old, str) else type(old)(float(value)) if old is not None else int(value)
        cfg = dataclasses.replace(cfg, **{stage: dataclasses.replace(getattr(cfg, stage), **{name: typed})})
    return cfg


def budget_use(store, views, ranked, evidence, budget: int) -> dict:
    """Per question, the @B context's composition (see the module doc). Shape: ranked (Q, C) -> means"""
    from memforest_gpu.store.timeutil import DATE_TAG

    acc = {k: [] for k in ("nodes", "merged_share", "date_share", "evidence_share", "originals_per_node")}
    for q, row in enumerate(ranked):
        used, parts = 0, []  # (node, tokens shown)
        for j in (int(x) for x in row if x >= 0):
            n = len(views.ws_end[j])
            take = min(n, budget - used)
            if take <= 0:
                break
            parts.append((j, take))
            used += take
        if not used:
            continue
        tags = sum(min(len(m.group().split()), t) for j, t in parts for m in DATE_TAG.finditer(views.rendered[j])
                   if m.start() < (views.ws_end[j][t - 1] if t else 0))
        acc["nodes"].append(len(parts))
        acc["merged_share"].append(sum(t for j, t in parts if len(store.sources[j]) > 1) / used)
        acc["date_share"].append(tags / used)
        ev = evidence[q]
        acc["evidence_share"].append(sum(t for j, t in parts if ev and not ev.isdisjoint(store.sources[j])) / used)
        acc["originals_per_node"].append(np.mean([len(store.sources[j]) for j, _ in parts]))
    return {k: float(np.mean(v)) for k, v in acc.items()}


def duplicates(store, original_vec: dict, original_text: dict, views, ranked, budget: int, cos: float) -> dict:
    """Repeated sources inside merged nodes: their share among merged nodes' sources, and the
    share of @B context tokens that are repeats shown verbatim."""
    rep_src = tot_src = 0
    rep_tok = np.zeros(len(store), dtype=np.int64)  # per node: whitespace tokens of repeated sources shown
    for j, src in enumerate(store.sources):
        if len(src) < 2:
            continue
        V = np.stack([original_vec[s] for s in src])  # (S, D) in time order of the sources list
        S = V @ V.T
        np.fill_diagonal(S, -1)
        rep = [i for i in range(len(src)) if (S[i, :i] >= cos).any()]  # repeats an earlier source
        rep_src += len(rep)
        tot_src += len(src)
        text = store.texts[j]
        rep_tok[j] = sum(len(original_text[src[i]].split()) for i in rep if original_text[src[i]] in text)
    shares = []
    for row in ranked:
        used = dup = 0
        for j in (int(x) for x in row if x >= 0):
            n = len(views.ws_end[j])
            take = min(n, budget - used)
            if take <= 0:
                break
            dup += rep_tok[j] * take / n
            used += take
        if used:
            shares.append(dup / used)
    return {"repeated_sources": rep_src / max(1, tot_src), "repeated_context": float(np.mean(shares))}


def shown_or_cut(views, ranked, evidence, budget: int) -> np.ndarray:
    """Per question, where its first evidence source sits at the @B cut: 2 = shown, 1 = in a
    node of the context but after the cut, 0 = in no node of the context; -1 without evidence."""
    out = np.full(len(ranked), -1)
    for q, row in enumerate(ranked):
        ev = evidence[q]
        if not ev:
            continue
        used, best = 0, 0
        for j in (int(x) for x in row if x >= 0):
            n = len(views.ws_end[j])
            take = min(n, budget - used)
            if take <= 0:
                break
            cut = views.ws_end[j][take - 1]
            starts = [p for s, p in views.starts[j].items() if s in ev]
            if starts:
                best = max(best, 2 if min(starts) < cut else 1)
            used += take
        out[q] = best
    return out


def lost_points(base: dict, comp: dict, categories: list[str], where: np.ndarray) -> dict:
    """AnsR@B points lost (net, as points of the uncompressed mean over all questions), split
    by whether EvR@B fell and, if it did, whether the evidence was in no node of the context
    (``not_reached``) or in a node cut before it (``cut``); overall and per category."""
    a0, a1 = base["B", "ansr"], comp["B", "ansr"]
    e0, e1 = np.nan_to_num(base["B", "evr"], nan=0.0), np.nan_to_num(comp["B", "evr"], nan=0.0)
    ok = ~np.isnan(a0) & ~np.isnan(a1)
    denom = np.nanmean(a0)
    fell = e1 < e0
    cats = np.array(categories)
    out = {}
    for cat in ["all", *sorted(set(categories))]:
        m = ok & (cats == cat) if cat != "all" else ok
        d = np.where(m, a0 - a1, 0.0)
        pts = lambda sel: float(100 * d[sel].sum() / ok.sum() / denom)  # noqa: E731
        out[cat] = {"evidence_fell": pts(fell), "not_reached": pts(fell & (where == 0)),
                    "cut": pts(fell & (where == 1)), "evidence_kept": pts(~fell)}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--benchmark",
                   default=os.path.join(HERE, "..", "..", "..", "..", "shared", "data", "locomo_dev5.json"))
    p.add_argument("--nodes", default="turns", help="turns | facts")
    p.add_argument("--ratio", type=float, default=0.7)
    p.add_argument("--methods", default="memforest:matching,tome")
    p.add_argument("--preset", default="memforest")
    p.add_argument("--set", action="append", default=[], help="stage.field=value on the preset (repeatable)")
    p.add_argument("--dup-cos", type=float, default=0.8, help="cosine from which two sources repeat each other")
    p.add_argument("--cache", default=os.path.join("runs", "quality_points", ".cache"))
    p.add_argument("--out", default=None, help="JSON records")
    a = p.parse_args(argv)

    import torch

    from memforest_gpu.evaluation.cache import CachedEmbedder
    from memforest_gpu.evaluation.harness import EvalConfig, _Questions, _score_store, ranked_candidates
    from memforest_gpu.evaluation.locomo import load_locomo
    from memforest_gpu.evaluation.methods import compress_with, parse_method
    from memforest_gpu.evaluation.metrics import NodeViews
    from memforest_gpu.mergers.embedders import SentenceTransformerEmbedder
    from memforest_gpu.retrieval.retriever import Retriever

    torch.set_num_threads(2)
    print_hardware()
    bench = load_locomo(a.benchmark, nodes=a.nodes)
    emb = CachedEmbedder(SentenceTransformerEmbedder(), a.cache)
    store = bench.store(emb, device="cpu")
    q = _Questions(bench, emb, "cpu")
    cfg, ecfg = _config(a.preset, a.set), EvalConfig(search_repeats=1)
    originals = dict(zip(store.ids, store.texts))
    vec = dict(zip(store.ids, store.embeddings.numpy()))
    _, base, _ = _score_store(store, q, ecfg, originals)
    base = {(c, m): v for (k, c, m), v in base.items() if k == "plain"}
    records = []
    cats = q.cats
    for label in a.methods.split(","):
        spec = parse_method(label)
        c = spec.config(cfg, ratio=a.ratio, seed=0)
        res = compress_with(spec, store, c, embedder=emb, device="cpu")
        emb.flush()
        out = res.store
        views = NodeViews.build(out, originals)
        ranked = ranked_candidates(Retriever(out), q.emb, q.tenants, ecfg, "plain")
        _, sc, _ = _score_store(out, q, ecfg, originals)
        sc = {(c_, m): v for (k, c_, m), v in sc.items() if k == "plain"}
        rec = {"method": label, "nodes": a.nodes, "ratio": a.ratio, "set": a.set}
        for metric in ("ansr", "ansr_content", "evr", "dates"):
            for cat in ["all", *cats]:
                m = q.cat_mask[cat]
                b, v = np.nanmean(base["B", metric][m]), np.nanmean(sc["B", metric][m])
                rec[f"B:{metric}:{cat}"] = 100 * v / b if metric != "dates" else v
        rec["lost"] = lost_points(base, sc, q.categories, shown_or_cut(views, ranked, q.evidence, ecfg.max_tokens))
        rec["budget"] = budget_use(out, views, ranked, q.evidence, ecfg.max_tokens)
        rec["dup"] = duplicates(out, vec, originals, views, ranked, ecfg.max_tokens, a.dup_cos)
        merged = [j for j, s in enumerate(out.sources) if len(s) > 1]
        rec["tags_per_merged"] = float(np.mean([len(views.dates[j]) - 1 for j in merged])) if merged else 0.0
        records.append(rec)
        print(f"{label} @{a.ratio:g} {a.nodes} {' '.join(a.set)}")
        print("  AnsR@B %  " + "  ".join(f"{c_}: {rec[f'B:ansr:{c_}']:.1f}" for c_ in ["all", *cats]))
        print("  AnsR-c@B %  " + "  ".join(f"{c_}: {rec[f'B:ansr_content:{c_}']:.1f}" for c_ in ["all", *cats]))
        print("  EvR@B %  " + "  ".join(f"{c_}: {rec[f'B:evr:{c_}']:.1f}" for c_ in ["all", *cats]))
        print("  lost points (evidence fell: not reached + cut / kept)  " + "  ".join(
            f"{c_}: {v['not_reached']:.1f}+{v['cut']:.1f}/{v['evidence_kept']:.1f}" for c_, v in rec["lost"].items()))
        print("  @B: " + ", ".join(f"{k} {v:.2f}" for k, v in rec["budget"].items())
              + f"; dates {rec['B:dates:all']:.1f}; tags per merged node {rec['tags_per_merged']:.2f}")
        print(f"  repeats: {100 * rec['dup']['repeated_sources']:.1f}% of merged nodes' sources, "
              f"{100 * rec['dup']['repeated_context']:.1f}% of @B tokens", flush=True)
    if a.out:
        write_records(a.out, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
