"""How a merged node is found: every retrieval rule scored on ONE set of compressed stores.

For each node shape, method, ratio and seed the benchmark is compressed once (the ``--preset``
with ``merge.keys = 0``, so the merges are today's) and its store written to ``OUT/stores``;
then every rule re-scores the same store (a rule changes only how nodes are scored, never the
merges): the keys of each merged node are made by the shipped code
(:func:`memforest_gpu.store.merged_keys.derive_keys`: its sources' own vectors, or ``k``
centres of them when it has more) and the shipped retriever ranks the questions' candidates
(plain top-k and AGPR), which the protocol's metrics score. Rules (``--keys``, ``--weights``):

- ``text``: the merged text's vector alone (today);
- ``k{K}/w{W}``: up to ``K`` keys (``all``: every source), a node with keys scored
  ``W * cos(text) + (1 - W) * best key's cos``: ``k1/w0`` is the normalised mean of the
  sources, ``k{K}/w0`` the best of ``K`` keys, ``W > 0`` the blends;
- ``max/k{K}``: the best of the text's vector and the ``K`` keys (M3-Agent's rule over a
  node's list of vectors; off with ``--no-max-rule``).

Writes ``OUT/scores.npz`` (per-question scores, key ``shape|method|ratio|seed|rule|retriever|cut|metric``),
``OUT/storage.json`` (bytes of text and vectors, vectors per node, per rule and cell) and
``OUT/questions.json`` (each question's conversation, per shape). The analysis is
``docs/studies/scripts/merged_keys_report.py``.

    python docs/studies/scripts/merged_keys.py --benchmark ../shared/data/locomo_dev5.json --nodes turns,facts \\
        --methods memforest:matching,memforest:sequential,tome,random_merge,random_prune,kmeans_prune,dart \\
        --ratios 0.3,0.5,0.7 --seeds 0 --cache CACHE --out OUT
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import numpy as np
import pyarrow as pa
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "bench"))  # bench/common.py
sys.path.insert(0, HERE)  # the other study scripts

from common import print_hardware  # noqa: E402

from memforest_gpu.config import RetrievalConfig, preset  # noqa: E402
from memforest_gpu.evaluation.cache import CachedEmbedder  # noqa: E402
from memforest_gpu.evaluation.locomo import load_locomo  # noqa: E402
from memforest_gpu.evaluation.methods import compress_with, parse_method  # noqa: E402
from memforest_gpu.evaluation.metrics import NodeViews, answer_tokens, score_ranked  # noqa: E402
from memforest_gpu.kernels.agpr import n_anchors  # noqa: E402
from memforest_gpu.mergers.embedders import SentenceTransformerEmbedder  # noqa: E402
from memforest_gpu.mergers.extractive import ExtractiveMerger  # noqa: E402
from memforest_gpu.retrieval.retriever import Retriever  # noqa: E402
from memforest_gpu.store.io import read_store, write_store  # noqa: E402
from memforest_gpu.store.keys import NodeKeys  # noqa: E402
from memforest_gpu.store.merged_keys import derive_keys  # noqa: E402

KEPT = (("B", "ansr"), ("B", "ansr_content"), ("B", "evr"), ("k", "evr"), ("k", "ansr"))
K, L, LAM, BUDGET = 10, 4, 0.2, 256  # the protocol's defaults (docs/evaluation.md)


def rankings():
    """(name, config) of the two ranked lists the protocol cuts (harness.EvalConfig.ranking)."""
    C = L * K
    return (("plain", RetrievalConfig(k=C)),
            ("agpr", RetrievalConfig(k=C, agpr=True, L=1, lam=n_anchors(K, LAM) / C, gamma=0.9)))


def rules(keys: list[str], weights: list[float], max_rule: bool) -> list[tuple[str, int | None, float | str]]:
    """(name, max_keys, text weight) of every rule; max_keys 0 = no keys; weight "max" = the max rule."""
    out: list[tuple[str, int | None, float | str]] = [("text", 0, 1.0)]
    for k in keys:
        mk = None if k == "all" else int(k)
        out += [(f"k{k}/w{w:g}", mk, w) for w in weights]
    if max_rule:
        out += [(f"max/k{k}", None if k == "all" else int(k), "max") for k in keys]
    return out


def with_text_key(keys: NodeKeys, emb: torch.Tensor) -> NodeKeys:
    """Every keyed node's text vector added as one more key, weight 0 (the max rule)."""
    counts = keys.counts + (keys.counts > 0)
    owner = keys.owner
    rows = np.flatnonzero(keys.counts > 0)
    vec = torch.cat([keys.vectors, emb[torch.as_tensor(rows)].float()])
    own = np.concatenate([owner, rows])
    order = np.argsort(own, kind="stable")
    src = pa.concat_arrays([keys.sources, pa.array([[] for _ in rows], type=keys.sources.type)])
    return NodeKeys.from_lists(counts, vec[torch.as_tensor(order)], src.take(pa.array(order)), text_weight=0.0,
                               max_keys=None)


class Questions:
    """A shape's questions: embeddings, tenants, answer tokens and evidence."""

    def __init__(self, bench, embedder):
        qs = bench.questions
        self.tenants = [q.tenant for q in qs]
        self.answers = [answer_tokens(q.answer) for q in qs]
        self.evidence = [frozenset(q.evidence) for q in qs]
        self.emb = embedder.embed([q.question for q in qs]).float()


def score_rules(inp, out, q: Questions, originals: dict, the_rules) -> tuple[dict, dict]:
    """{(rule, retriever, cut, metric): (Q,) float32} of one compressed store under every rule,
    and the keys made for each bound."""
    views = NodeViews.build(out, originals)
    made: dict = {}
    res = {}
    for name, mk, w in the_rules:
        out.keys = None
        if mk != 0:
            if mk not in made:
                made[mk] = derive_keys(inp, out.sources.arrow, max_keys=mk, text_weight=0.0)
            base = made[mk]
            out.keys = with_text_key(base, out.embeddings) if w == "max" else NodeKeys(
                base.vectors, base.offsets, base.sources, float(w), mk)
        r = Retriever(out)
        for kind, cfg in rankings():
            ranked = r.search(q.emb, tenants=q.tenants, config=cfg).index.cpu().numpy()
            sc = score_ranked(ranked, views, q.answers, q.evidence, k=K, max_tokens=BUDGET)
            for cut, metric in KEPT:
                res[name, kind, cut, metric] = sc[cut, metric].astype(np.float32)
    out.keys = None
    return res, {mk: v for mk, v in made.items()}


def storage(inp, out, made: dict) -> dict:
    """Bytes of text and of vectors, and vectors per node, of a store and each keys bound."""
    text = sum(len(t.encode("utf-8")) for t in out.texts)
    vec = len(out) * out.dim * 4
    rec = {"nodes": len(out), "text_bytes": text, "vector_bytes": vec,
           "merged_nodes": int(sum(len(s) > 1 for s in out.sources))}
    for mk, keys in made.items():
        rec[f"keys_{'all' if mk is None else mk}"] = {"keys": int(keys.vectors.shape[0]),
                                                      "key_bytes": keys.nbytes(),
                                                      "max_per_node": int(keys.counts.max(initial=0))}
    return rec


def run_shape(a, shape: str, embedder, merger, the_rules, scores: dict, store_info: dict, qinfo: dict):
    bench = load_locomo(a.benchmark, nodes=shape)
    inp = bench.store(embedder, device="cpu")
    q = Questions(bench, embedder)
    embedder.flush()
    qinfo[shape] = {"tenants": q.tenants, "ids": [x.id for x in bench.questions],
                    "categories": [x.category for x in bench.questions]}
    originals = dict(zip(inp.ids, inp.texts))
    base, _ = score_rules(inp, inp, q, originals, [("text", 0, 1.0)])
    for (_rule, kind, cut, metric), v in base.items():
        scores[f"{shape}|none|0|0|text|{kind}|{cut}|{metric}"] = v
    store_info[f"{shape}|none"] = storage(inp, inp, {})
    cfg0 = preset(a.preset)
    cfg0 = dataclasses.replace(cfg0, merge=dataclasses.replace(cfg0.merge, keys=0, text_weight=1.0))
    for ratio in a.ratios:
        for method in a.methods:
            spec = parse_method(method)
            for seed in a.seeds:
                t0 = time.perf_counter()
                path = os.path.join(a.out, "stores", shape, f"{spec.label.replace(':', '-')}_{ratio:g}_{seed}.parquet")
                if os.path.exists(path):
                    out = read_store(path)
                else:
                    c = spec.config(cfg0, ratio=ratio, seed=seed)
                    out = compress_with(spec, inp, c, merger=merger, embedder=embedder, device="cpu").store
                    embedder.flush()
                    write_store(out, path)
                t1 = time.perf_counter()
                merging = any(len(s) > 1 for s in out.sources)
                res, made = score_rules(inp, out, q, originals, the_rules if merging else the_rules[:1])
                for (rule, kind, cut, metric), v in res.items():
                    scores[f"{shape}|{spec.label}|{ratio:g}|{seed}|{rule}|{kind}|{cut}|{metric}"] = v
                store_info[f"{shape}|{spec.label}|{ratio:g}|{seed}"] = storage(inp, out, made)
                print(f"{shape} {spec.label} {ratio:g} seed {seed}: {len(out)} nodes, compressed in {t1 - t0:.0f} s, "
                      f"{len(res) // (2 * len(KEPT))} rules scored in {time.perf_counter() - t1:.0f} s", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--benchmark", required=True)
    ap.add_argument("--nodes", default="turns,facts")
    ap.add_argument("--methods", default="memforest:matching,memforest:sequential,tome,random_merge")
    ap.add_argument("--ratios", default="0.3,0.5,0.7")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--preset", default="memforest")
    ap.add_argument("--keys", default="1,2,3,4,all", help="key bounds (all: every source)")
    ap.add_argument("--weights", default="0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9", help="text weights")
    ap.add_argument("--no-max-rule", action="store_true")
    ap.add_argument("--cache", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    a.ratios = [float(x) for x in a.ratios.split(",")]
    a.seeds = [int(x) for x in a.seeds.split(",")]
    a.methods = [m for m in a.methods.split(",") if m]
    torch.set_num_threads(1)
    print_hardware()
    the_rules = rules(a.keys.split(","), [float(x) for x in a.weights.split(",")], not a.no_max_rule)
    embedder = CachedEmbedder(SentenceTransformerEmbedder(), a.cache)
    merger = ExtractiveMerger()
    scores: dict = {}
    store_info: dict = {}
    qinfo: dict = {}
    for shape in a.nodes.split(","):
        run_shape(a, shape, embedder, merger, the_rules, scores, store_info, qinfo)
        os.makedirs(a.out, exist_ok=True)
        np.savez_compressed(os.path.join(a.out, "scores.npz"), **scores)
        with open(os.path.join(a.out, "storage.json"), "w") as f:
            json.dump({"stores": store_info, "dim": 384, "rules": [r[0] for r in the_rules]}, f, indent=1)
        with open(os.path.join(a.out, "questions.json"), "w") as f:
            json.dump(qinfo, f)
    print(f"wrote {a.out}/scores.npz ({len(scores)} arrays), storage.json, questions.json")


if __name__ == "__main__":
    main()
