"""Does the event partition earn its place where it changes K? The LoCoMo dev file with every
conversation in one tenant (~2,760 nodes), MemForest with the memforest preset's tree and
schedule (and its tree graph: ``knn`` by default, ``--graph dense`` for every pair) at several
alphas (K = floor(alpha * N); alpha 0 gives K = 1, one tree), plain top-k retention of
AnsR@B and AnsR-c@B per ratio. Questions still retrieve from the one tenant.

    python docs/studies/scripts/partition_one_tenant.py --benchmark ../shared/data/locomo_dev5.json \
        --alphas 0,0.001,0.01,0.05 --ratios 0.5 --seeds 0 --cache /tmp/evalcache
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time

import numpy as np


def one_tenant(bench, name: str = "all"):
    """The benchmark with every node and question in tenant ``name``."""
    from memforest_gpu.evaluation.dataset import Benchmark

    nodes = [{**n, "tenant": name} for n in bench.nodes]
    qs = [dataclasses.replace(q, tenant=name) for q in bench.questions]
    return Benchmark(bench.name + "-one-tenant", nodes, qs, dict(bench.info))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--benchmark", required=True)
    ap.add_argument("--alphas", default="0,0.001,0.01,0.05")
    ap.add_argument("--graph", default=None, help="knn | dense (default: the preset's, knn)")
    ap.add_argument("--ratios", default="0.5")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--cache", required=True)
    ap.add_argument("--out", default="runs/partition_one_tenant.json")
    a = ap.parse_args(argv)
    import torch

    from memforest_gpu.config import preset
    from memforest_gpu.engine.partition import n_clusters
    from memforest_gpu.evaluation.benchmark import load_benchmark
    from memforest_gpu.evaluation.cache import CachedEmbedder
    from memforest_gpu.evaluation.harness import EvalConfig, cell_key, run_grid
    from memforest_gpu.mergers.embedders import SentenceTransformerEmbedder

    torch.set_num_threads(1)
    bench = one_tenant(load_benchmark(a.benchmark))
    emb = CachedEmbedder(SentenceTransformerEmbedder(), a.cache)
    ratios = [float(x) for x in a.ratios.split(",")]
    seeds = [int(x) for x in a.seeds.split(",")]
    base = preset("memforest")
    if a.graph:
        base = dataclasses.replace(base, spanning=dataclasses.replace(base.spanning, graph=a.graph))
    recs = []
    for alpha in [float(x) for x in a.alphas.split(",")]:
        cfg = dataclasses.replace(base, partition=dataclasses.replace(base.partition, alpha=alpha))
        t0 = time.perf_counter()
        res = run_grid(bench, ["memforest:matching"], ratios, seeds, embedder=emb, base_config=cfg,
                       eval_config=EvalConfig(search_repeats=1))
        emb.flush()
        for r in ratios:
            row = {"alpha": alpha, "K": n_clusters(len(bench.nodes), alpha), "graph": base.spanning.graph, "ratio": r,
                   "seeds": seeds,
                   "seconds": time.perf_counter() - t0}
            for cut, metric in (("B", "ansr"), ("B", "ansr_content"), ("k", "evr"), ("B", "evr")):
                base_q = res.per_question[cell_key("none", 0.0, 0, "plain", cut, metric)]
                vals = [np.nanmean(res.per_question[cell_key("memforest:matching", r, s, "plain", cut, metric)])
                        / np.nanmean(base_q) for s in seeds]
                row[f"{metric}@{cut}"] = float(np.mean(vals))
            print(json.dumps(row), flush=True)
            recs.append(row)
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(recs, f, indent=1)


if __name__ == "__main__":
    main()
