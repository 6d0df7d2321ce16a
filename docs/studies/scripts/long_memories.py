"""Long memories (issue 38): lost answers by cause, and remedies side by side, on the LoCoMo dev file.

For every shape (``memforest_gpu.evaluation.long_shapes``: turns, facts, w4, w8, sessions, ku),
ratio and variant (``NAME=METHOD[;stage.field=value...]``, e.g. ``nocap=memforest:matching;
merge.max_node_tokens=100000``; ``preset`` is ``memforest:matching`` under ``--preset``), compress
once, rank with the store's own rule (plain top-k), fill the ``@B`` context both ways
(``--fills plain,matched``: the protocol's cut, or each merged node rendered for the question,
``evaluation/context_fill.py``; ``ranked:keys``: the context ``memforest search --budget`` gives,
``memforest_gpu/retrieval/context.py``) and write per question AnsR@B, AnsR-c@B, EvR@B and the cause of
each lost answer (``evaluation/lost_answers.py``), plus the store's bytes (UTF-8 text, int8 text
vectors and keys, key ids) against the uncompressed store's (text and float32 vectors), and the
written Parquet file's size against the uncompressed store's file (``file_bytes_pct``). A ``focused``
fill (``focused:keys``, retrieval/context.py) also changes the uncompressed store's context: it is
scored there too (``shape|none|0|focused:keys|metric``; the records' ``*_same_fill`` retention).

    python docs/studies/scripts/long_memories.py --benchmark ../shared/data/locomo_dev5.json \\
        --shapes w4,w8,sessions,ku --ratios 0.5,0.7 \\
        --variants preset,nocap=memforest:matching;merge.max_node_tokens=100000 --cache /tmp/cache --out /tmp/long

Writes OUT/records.json (one record per shape, variant, ratio, fill) and OUT/scores.npz (per question,
keys ``shape|variant|ratio|fill|metric``, ``shape|none|0|plain|metric`` the uncompressed store's, and
``shape|tenants``); ``docs/studies/scripts/long_memories_report.py`` makes the tables and the bootstrap.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "bench"))  # bench/common.py
sys.path.insert(0, HERE)  # the other study scripts

from common import print_hardware  # noqa: E402


def variant_config(spec: str, preset_name: str):
    """``NAME=METHOD[;stage.field=value...]`` -> (name, MethodSpec, config)."""
    from memforest_gpu.config import preset
    from memforest_gpu.evaluation.methods import parse_method

    name, _, rest = spec.partition("=")
    parts = (rest or "memforest:matching").split(";")
    cfg = preset(preset_name)
    for s in parts[1:]:
        key, _, value = s.partition("=")
        stage, _, field = key.partition(".")
        stage = {"tree": "spanning"}.get(stage, stage)  # the spanning stage's name before it was renamed
        old = getattr(getattr(cfg, stage), field)
        typed = value if isinstance(old, str) else (None if value == "None" else type(old)(float(value))
                                                    if old is not None else _number(value))
        cfg = dataclasses.replace(cfg, **{stage: dataclasses.replace(getattr(cfg, stage), **{field: typed})})
    return name, parse_method(parts[0]), cfg


def _number(value: str):
    """``"3"`` -> 3, ``"0.8"`` -> 0.8."""
    return int(value) if value.lstrip("-").isdigit() else float(value)


def store_bytes(store) -> int:
    """UTF-8 text + one byte per dimension per vector (int8 codes) + key ids."""
    text = sum(len(t.encode("utf-8")) for t in store.texts)
    rows = len(store) + (int(store.keys.vectors.shape[0]) if store.keys is not None else 0)
    ids = sum(len(s.encode("utf-8")) for lst in store.keys.sources.to_pylist() for s in lst) if store.keys else 0
    return text + rows * store.dim + ids


def file_bytes(a, stem: str, store) -> int:
    """Bytes of the store written as Parquet (zstd, the vectors in the store's own codes: int8 for
    the preset's output, float32 for the uncompressed store): OUT/stores/STEM.parquet."""
    from memforest_gpu.store.io import write_store

    path = os.path.join(a.out, "stores", f"{stem}.parquet")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_store(store, path)
    return os.path.getsize(path)


def score_fills(store, q, views, fills, budget, originals, ts, questions, emb=None):
    """Per fill (``FILL`` or ``FILL:keys``, the parts cut by the keys, evaluation/key_parts.py):
    (contexts, @B scores, ranked)."""
    from memforest_gpu.evaluation.context_fill import contexts, score_contexts
    from memforest_gpu.evaluation.harness import EvalConfig, ranked_candidates
    from memforest_gpu.evaluation.key_parts import key_split
    from memforest_gpu.retrieval.retriever import Retriever

    ranked = ranked_candidates(Retriever(store), q.emb, q.tenants, EvalConfig(search_repeats=1), "plain")
    out = {}
    for fill in fills:
        how, _, by = fill.partition(":")
        ctx = contexts(ranked, store, views, budget, fill=how, q_emb=q.emb, questions=questions,
                       original_text=originals, original_ts=ts, split=key_split(emb.embed) if by == "keys" else None)
        out[fill] = (ctx, score_contexts(ctx, q.answers, q.evidence), ranked)
    return out


def compressed(a, shape, name, ratio, spec, cfg, store, emb):
    """(compressed store, report figures), read back from OUT/stores when a run made it."""
    from memforest_gpu.evaluation.methods import compress_with
    from memforest_gpu.store.io import read_store, write_store

    path = os.path.join(a.out, "stores", f"{shape}_{name}_{ratio:g}.parquet")
    if os.path.exists(path) and os.path.exists(path + ".json"):
        with open(path + ".json") as f:
            return read_store(path), json.load(f)
    res = compress_with(spec, store, spec.config(cfg, ratio=ratio, seed=a.seed), embedder=emb, device="cpu")
    emb.flush()
    rep = {"ratio_reached": res.report.ratio_reached, "condensed": getattr(res.report, "condensed", 0),
           "condensed_tokens": getattr(res.report, "condensed_tokens", 0)}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_store(res.store, path)
    with open(path + ".json", "w") as f:
        json.dump(rep, f)
    return res.store, rep


def run_shape(a, shape, emb, records, scores):
    from memforest_gpu.evaluation.harness import _Questions
    from memforest_gpu.evaluation.long_shapes import load_shape
    from memforest_gpu.evaluation.lost_answers import classify, lost_table, update_reading
    from memforest_gpu.evaluation.metrics import NodeViews

    bench = load_shape(a.benchmark, shape, seed=a.shape_seed)
    store = bench.store(emb, device="cpu")
    q = _Questions(bench, emb, "cpu")
    emb.flush()
    originals = dict(zip(store.ids, store.texts))
    ts = dict(zip(store.ids, store.timestamps.tolist()))
    texts = [x.question for x in q.questions]
    base_bytes = sum(len(t.encode("utf-8")) for t in store.texts) + len(store) * store.dim * 4
    base_fills = ["plain"] + [f for f in a.fills if f.split(":")[0] in ("focused", "pooled")]  # change originals
    bases = score_fills(store, q, NodeViews.build(store, originals), base_fills, a.budget, originals, ts, texts, emb)
    base = bases["plain"]
    scores[f"{shape}|tenants"] = np.array(q.tenants)
    scores[f"{shape}|categories"] = np.array(q.categories)
    for fill, (_, sc, _) in bases.items():
        for m, v in sc.items():
            scores[f"{shape}|none|0|{fill}|{m}"] = v
    base_file = file_bytes(a, f"{shape}_none", store)
    updates = bench.info.get("updates", {})
    for spec_text in a.variants:
        name, spec, cfg0 = variant_config(spec_text, a.preset)
        for ratio in a.ratios:
            t0 = time.perf_counter()
            out, rep = compressed(a, shape, name, ratio, spec, cfg0, store, emb)
            t_comp = time.perf_counter() - t0
            views = NodeViews.build(out, originals)
            fills = score_fills(out, q, views, a.fills, a.budget, originals, ts, texts, emb)
            emb.flush()
            for fill, (ctx, sc, ranked) in fills.items():
                cause, lost = classify(base[0], ctx, out, q.answers, q.evidence, originals, ranked)
                key = f"{shape}|{name}|{ratio:g}|{fill}"
                for m, v in sc.items():
                    scores[f"{key}|{m}"] = v
                scores[f"{key}|cause"] = cause.astype(str)
                rec = {"shape": shape, "variant": name, "spec": spec_text, "ratio": ratio, "fill": fill,
                       "nodes": len(out), **rep,
                       "bytes_pct": 100 * store_bytes(out) / base_bytes, "compress_s": t_comp,
                       "file_bytes_pct": 100 * file_bytes(a, f"{shape}_{name}_{ratio:g}", out) / base_file,
                       "words_per_node": float(np.mean([len(t.split()) for t in out.texts])),
                       "lost": lost_table(cause, lost, base[1]["ansr"])}
                for m in ("ansr", "ansr_content", "evr"):
                    rec[m] = 100 * np.nanmean(sc[m]) / np.nanmean(base[1][m])
                    if fill in bases:  # against the uncompressed store under the same fill
                        rec[f"{m}_same_fill"] = 100 * np.nanmean(sc[m]) / np.nanmean(bases[fill][1][m])
                if updates:
                    rec["updates"] = update_reading(ctx, updates, q.ids)
                    rec["updates_base"] = update_reading(base[0], updates, q.ids)
                records.append(rec)
                lt = rec["lost"]
                print(f"{shape} {name} @{ratio:g} {fill}: AnsR@B {rec['ansr']:.1f} AnsR-c@B {rec['ansr_content']:.1f} "
                      f"EvR@B {rec['evr']:.1f}" + (f" (same fill {rec['ansr_same_fill']:.1f})" if fill in bases else "")
                      + f" | reached {rec['ratio_reached']:.3f} bytes {rec['bytes_pct']:.0f}% "
                      f"file {rec['file_bytes_pct']:.0f}% "
                      f"words/node {rec['words_per_node']:.0f} condensed {rec['condensed']} | lost "
                      + " ".join(f"{c} {v['answers']}/{v['points']:.1f}" for c, v in lt.items())
                      + (f" | ku {rec['updates']}" if updates else "") + f" | {t_comp:.0f}s", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--benchmark",
                   default=os.path.join(HERE, "..", "..", "..", "..", "shared", "data", "locomo_dev5.json"))
    p.add_argument("--shapes", default="w4,w8,sessions,ku")
    p.add_argument("--ratios", default="0.5,0.7")
    p.add_argument("--variants", default="preset", help="NAME=METHOD[;stage.field=value...], separated by ','")
    p.add_argument("--fills", default="plain,matched")
    p.add_argument("--preset", default="memforest")
    p.add_argument("--seed", type=int, default=0, help="the methods' seed (random merge, ...)")
    p.add_argument("--shape-seed", type=int, default=0,
                   help="the seed that draws the knowledge-update shapes' values, sessions and turns")
    p.add_argument("--budget", type=int, default=256)
    p.add_argument("--cache", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    a.ratios = [float(x) for x in a.ratios.split(",")]
    a.variants = a.variants.split(",")
    a.fills = a.fills.split(",")

    import torch

    from memforest_gpu.evaluation.cache import CachedEmbedder
    from memforest_gpu.mergers.embedders import SentenceTransformerEmbedder

    torch.set_num_threads(1)
    print_hardware()
    emb = CachedEmbedder(SentenceTransformerEmbedder(), a.cache)
    os.makedirs(a.out, exist_ok=True)
    records: list = []
    scores: dict = {}
    for shape in a.shapes.split(","):
        run_shape(a, shape, emb, records, scores)
        with open(os.path.join(a.out, "records.json"), "w") as f:
            json.dump(records, f, indent=1)
        np.savez_compressed(os.path.join(a.out, "scores.npz"), **scores)
    return 0


if __name__ == "__main__":
    sys.exit(main())
