"""Quality effect of the engine's storage dtype (``CompressConfig.storage_dtype``) on LoCoMo dev.

MemForest with the tuned setting (matching schedule, alpha 0.001, time weight 0.5, size
weight 0.2), extractive merger, seed 0, at each ratio, once per storage dtype, through the
evaluation harness (:func:`memforest_gpu.evaluation.harness.run_grid`); the dtype reaches
the engine as a config field, so nothing is cast by hand. Prints AnsR@B and EvR@10 (plain
top-k and AGPR, all questions) per dtype and ratio and writes flat JSON records.

    python docs/studies/scripts/storage_dtype.py [--benchmark ../shared/data/locomo_dev5.json] [--ratios 0.3,0.5,0.7]
        [--dtypes float32,float16,bfloat16] [--cache DIR] [--out runs/storage_dtype.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "bench"))  # bench/common.py
sys.path.insert(0, HERE)  # the other study scripts

from common import print_hardware, write_records  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--benchmark",
                   default=os.path.join(HERE, "..", "..", "..", "..", "shared", "data", "locomo_dev5.json"))
    p.add_argument("--ratios", default="0.3,0.5,0.7")
    p.add_argument("--dtypes", default="float32,float16,bfloat16")
    p.add_argument("--cache", default=os.path.join("runs", "storage_dtype", ".cache"),
                   help="embedding cache folder (re-runs never re-embed)")
    p.add_argument("--out", default=os.path.join("runs", "storage_dtype.json"))
    p.add_argument("--device", default="cpu")
    a = p.parse_args(argv)

    import torch

    from memforest_gpu.config import (
        CompressConfig,
        MergeConfig,
        PartitionConfig,
        SpanningConfig,
    )
    from memforest_gpu.evaluation.benchmark import load_benchmark
    from memforest_gpu.evaluation.cache import CachedEmbedder
    from memforest_gpu.evaluation.harness import EvalConfig, run_grid
    from memforest_gpu.mergers.embedders import SentenceTransformerEmbedder

    torch.set_num_threads(1)
    print_hardware()
    bench = load_benchmark(a.benchmark)
    emb = CachedEmbedder(SentenceTransformerEmbedder(), a.cache)
    ratios = [float(x) for x in a.ratios.split(",")]
    tuned = CompressConfig(partition=PartitionConfig(alpha=0.001),
                           spanning=SpanningConfig(time_weight=0.5, size_weight=0.2),
                           merge=MergeConfig(schedule="matching"))
    out = []
    print(f"{'dtype':>9} {'ratio':>5} {'retriever':>9} {'AnsR@B':>7} {'EvR@10':>7}")
    for dt in a.dtypes.split(","):
        cfg = dataclasses.replace(tuned, storage_dtype=dt)
        res = run_grid(bench, ["memforest:matching"], ratios, [0], embedder=emb, base_config=cfg,
                       eval_config=EvalConfig(search_repeats=1), device=a.device)
        emb.flush()
        got = {(r["ratio"], r["retriever"], r["cut"], r["metric"]): r["value"] for r in res.records
               if r["category"] == "all" and r["method"] in ("memforest", "none")}
        for ratio in ratios:
            for kind in ("plain", "agpr"):
                ansr, evr = got.get((ratio, kind, "B", "ansr")), got.get((ratio, kind, "k", "evr"))
                print(f"{dt:>9} {ratio:>5} {kind:>9} {100 * ansr:7.2f} {100 * evr:7.2f}", flush=True)
                out.append({"bench": "storage_dtype", "dtype": dt, "ratio": ratio, "retriever": kind,
                            "ansr_B": ansr, "evr_10": evr})
    write_records(a.out, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
