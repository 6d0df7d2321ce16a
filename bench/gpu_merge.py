"""LLM merge throughput: merges/s and tokens/s of a merger for a given model, one batch size
per line, plus (``--compress``) a whole compression of the bundled sample store.

    python bench/gpu_merge.py --model /models/Qwen2.5-1.5B-Instruct --batches 64,256,1024 \
        --out runs/gpu/merge.json
    python bench/gpu_merge.py --merger openai --model qwen --base-url http://127.0.0.1:8000/v1
    python bench/gpu_merge.py --merger transformers --model path/to/SmolLM2.gguf --batches 4 --device cpu

Pairs are real neighbouring memories of the sample store (older first, one tenant), so
prompts have realistic lengths. Each batch size is one ``merge`` call after a warm-up call.
Writes flat JSON records (hardware fields + one record per line printed).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import Timer, print_hardware, write_records  # noqa: E402

from memforest_gpu.cli.demo import sample_path  # noqa: E402
from memforest_gpu.mergers import get_merger  # noqa: E402
from memforest_gpu.mergers.base import MemoryItem, MergePair  # noqa: E402
from memforest_gpu.store.timeutil import parse_timestamp  # noqa: E402


def sample_pairs(n: int) -> list[MergePair]:
    """``n`` distinct pairs (i, i + gap) of one tenant's memories, older first."""
    by_tenant: dict[str, list[MemoryItem]] = {}
    with open(sample_path(), encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            by_tenant.setdefault(r.get("tenant", "default"), []).append(
                MemoryItem(r["id"], r["text"], parse_timestamp(r["timestamp"])))
    out: list[MergePair] = []
    gap = 1
    while len(out) < n:
        for tenant, items in by_tenant.items():
            items = sorted(items, key=lambda m: m.timestamp)
            out += [MergePair(items[i], items[i + gap], tenant) for i in range(len(items) - gap)]
        gap += 1
    return out[:n]


def build_merger(a):
    opts = {"model": a.model, "max_tokens": a.max_tokens}
    if a.merger == "vllm":
        opts.update(dtype=a.dtype, tensor_parallel_size=a.tp, gpu_memory_utilization=a.gpu_mem)
    elif a.merger == "transformers":
        opts.update(dtype=a.dtype, batch_size=a.batch_size, device=a.device)
    elif a.merger == "openai":
        opts.update(base_url=a.base_url, max_concurrency=a.max_concurrency)
    return get_merger(a.merger, **opts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="model directory, .gguf file or served model name")
    ap.add_argument("--merger", default="vllm", choices=["vllm", "transformers", "openai"])
    ap.add_argument("--batches", default="64,256,1024", help="pairs per merge call, comma-separated")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--tp", type=int, default=1, help="vllm: tensor-parallel size")
    ap.add_argument("--gpu-mem", type=float, default=None, help="vllm: GPU memory fraction (default: from free memory)")
    ap.add_argument("--batch-size", type=int, default=32, help="transformers: prompts per generate")
    ap.add_argument("--device", default=None, help="transformers: cpu | cuda")
    ap.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="openai: endpoint")
    ap.add_argument("--max-concurrency", type=int, default=64, help="openai: requests in flight")
    ap.add_argument("--compress", action="store_true", help="also compress the sample store (ratio 0.5)")
    ap.add_argument("--out", default="runs/gpu/merge.json")
    a = ap.parse_args(argv)
    batches = [int(x) for x in a.batches.split(",")]
    print_hardware()
    merger = build_merger(a)
    with Timer() as t_load:
        merger.load()
    print(f"# {a.merger} {a.model}: loaded in {t_load.seconds:.1f}s", flush=True)
    merger.merge(sample_pairs(8))  # warm-up: compile, cache, first-request latency
    records = []
    print(f"{'merger':<12} {'batch':>6} {'seconds':>8} {'merges/s':>9} {'gen tok/s':>10} {'tok/s':>9} "
          f"{'accepted':>8} {'retried':>7} {'fallback':>8}", flush=True)
    for n in batches:
        pairs = sample_pairs(n)
        before = merger.summary()
        with Timer() as t:
            merger.merge(pairs)
        after = merger.summary()
        d = {k: after[k] - before[k] for k in ("accepted", "retries", "retry_accepted", "fallbacks",
                                                "prompt_tokens", "completion_tokens", "calls")}
        rec = {"bench": "merge", "merger": a.merger, "model": a.model, "batch": n, "max_tokens": a.max_tokens,
               "seconds": t.seconds, "merges_per_s": n / t.seconds,
               "completion_tokens_per_s": d["completion_tokens"] / t.seconds,
               "tokens_per_s": (d["prompt_tokens"] + d["completion_tokens"]) / t.seconds, "load_s": t_load.seconds,
               **d}
        records.append(rec)
        print(f"{a.merger:<12} {n:>6} {t.seconds:>8.2f} {rec['merges_per_s']:>9.1f} "
              f"{rec['completion_tokens_per_s']:>10.0f} {rec['tokens_per_s']:>9.0f} {d['accepted']:>8} "
              f"{d['retries']:>7} {d['fallbacks']:>8}", flush=True)
    if a.compress:
        records.append(_compress_sample(a, merger))
    write_records(a.out, records)
    return 0


def _compress_sample(a, merger) -> dict:
    from memforest_gpu.config import CompressConfig, MergeConfig
    from memforest_gpu.engine import compress
    from memforest_gpu.mergers.embedders import SentenceTransformerEmbedder
    from memforest_gpu.store.io import read_store

    emb = SentenceTransformerEmbedder()
    store = read_store(sample_path(), embedder=emb)
    before = merger.summary()
    t0 = time.perf_counter()
    res = compress(store, CompressConfig(merge=MergeConfig(ratio=0.5)), merger=merger, embedder=emb)
    sec = time.perf_counter() - t0
    after = merger.summary()
    r = res.report
    rec = {"bench": "compress_sample", "merger": a.merger, "model": a.model, "nodes_in": r.nodes_in,
           "nodes_out": r.nodes_out, "rounds": r.rounds, "merges": r.merges, "seconds": sec,
           "merge_seconds": r.seconds.get("merge", 0.0), "merges_per_s": r.merges / sec,
           "fallbacks": after["fallbacks"] - before["fallbacks"], "retries": after["retries"] - before["retries"],
           "engine_fallbacks": r.fallbacks,
           "completion_tokens_per_s": (after["completion_tokens"] - before["completion_tokens"]) / sec}
    print(f"compress sample ({r.nodes_in} -> {r.nodes_out}): {r.rounds} rounds, {r.merges} merges in {sec:.1f}s "
          f"({rec['merges_per_s']:.1f} merges/s), {rec['fallbacks']} fallbacks, {rec['retries']} retries",
          flush=True)
    return rec


if __name__ == "__main__":
    sys.exit(main())
