"""How far the nearest-neighbour tree graph (``graph="knn"``) moves the merges from the dense
graph's, on the LoCoMo dev file: the fraction of merges (tenant, pair of ids) both runs
make, the fraction of first-round merges they share, and the time of the tree stage
(partition excluded), one line per (tenant layout, ratio, graph, knn). The memforest preset,
the extractive merger and re-embedded merged text (all-MiniLM-L6-v2, cached), as the
evaluation harness runs them.

    python docs/studies/scripts/knn_graph.py --benchmark ../shared/data/locomo_dev5.json --cache /tmp/evalcache \\
        --ratios 0.3,0.5,0.7 --knn 8,16,32 [--one-tenant] [--time-weight 0 --size-weight 0]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import time


def merges(res) -> set:
    return {(m.tenant, frozenset((m.a, m.b))) for m in res.merges}


def first_round(res) -> set:
    return {(m.tenant, frozenset((m.a, m.b))) for m in res.merges if m.round == 1}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--benchmark", required=True)
    ap.add_argument("--cache", required=True)
    ap.add_argument("--ratios", default="0.3,0.5,0.7")
    ap.add_argument("--knn", default="8,16,32")
    ap.add_argument("--one-tenant", action="store_true", help="every conversation in one tenant, one tree (alpha 0)")
    ap.add_argument("--time-weight", type=float, default=None, help="override the preset's (0: cosine edges)")
    ap.add_argument("--size-weight", type=float, default=None, help="override the preset's")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="runs/knn_graph.json")
    a = ap.parse_args(argv)
    import torch

    from memforest_gpu import compress
    from memforest_gpu.config import preset
    from memforest_gpu.evaluation.benchmark import load_benchmark
    from memforest_gpu.evaluation.cache import CachedEmbedder
    from memforest_gpu.mergers.embedders import SentenceTransformerEmbedder
    from memforest_gpu.mergers.extractive import ExtractiveMerger

    torch.set_num_threads(a.threads)
    print(json.dumps({"machine": platform.processor() or platform.machine(), "threads": a.threads,
                      "torch": torch.__version__}), flush=True)
    bench = load_benchmark(a.benchmark)
    if a.one_tenant:
        from partition_one_tenant import one_tenant

        bench = one_tenant(bench)
    emb = CachedEmbedder(SentenceTransformerEmbedder(device="cpu"), a.cache)
    store = bench.store(emb, device="cpu")
    base = preset("memforest")
    if a.one_tenant:
        base = dataclasses.replace(base, partition=dataclasses.replace(base.partition, alpha=0.0))
    terms = {k: v for k, v in (("time_weight", a.time_weight), ("size_weight", a.size_weight)) if v is not None}
    base = dataclasses.replace(base, spanning=dataclasses.replace(base.spanning, **terms))
    rows = []
    for ratio in [float(x) for x in a.ratios.split(",")]:
        runs = {}
        for graph, knn in [("dense", 0)] + [("knn", int(k)) for k in a.knn.split(",")]:
            spanning = dataclasses.replace(base.spanning, graph=graph, **({"knn": knn} if knn else {}))
            cfg = dataclasses.replace(base, spanning=spanning, merge=dataclasses.replace(base.merge, ratio=ratio))
            t0 = time.perf_counter()
            res = compress(store, cfg, merger=ExtractiveMerger(), embedder=emb, device="cpu")
            wall = time.perf_counter() - t0
            emb.flush()
            runs[(graph, knn)] = res
            ref = runs[("dense", 0)]
            same = len(merges(res) & merges(ref)) / max(1, len(merges(ref)))
            same1 = len(first_round(res) & first_round(ref)) / max(1, len(first_round(ref)))
            row = {"layout": "one tenant" if a.one_tenant else "tenant per conversation", "nodes": len(store),
                   "time_weight": base.spanning.time_weight, "size_weight": base.spanning.size_weight,
                   "trees": res.report.trees, "ratio": ratio, "graph": graph, "knn": knn or None,
                   "merges": len(res.merges), "rounds": res.report.rounds, "same_merges": round(same, 4),
                   "same_first_round": round(same1, 4), "tree_stage_s": round(res.report.seconds["trees"], 2),
                   "setup_s": round(res.report.seconds["setup"], 2), "wall_s": round(wall, 2)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
