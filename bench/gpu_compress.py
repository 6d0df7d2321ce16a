"""Step 2 of the GPU verification run: a whole ``compress`` of a 1M-node store on the device.

The command line's default preset, then ``--preset paper``, each as the scaling benchmark runs
them (``--kmeans two-level --schedule matching --embedder none``, the extractive merger): the
seconds of each stage, the peak device memory (``torch.cuda.max_memory_allocated``) of the
whole run and of each stage (:mod:`stage_memory`'s marks), the rounds, and the host reads
and host-to-device copies (``tests/host_reads.py``; both stall
the stream), in all and per round. One record per preset, written as soon as it is done.
"""
from __future__ import annotations

import argparse
import dataclasses
import time

from accounting import account, count_stages, format_accounting, text_stages
from gpu_ctx import Ctx, fast_store
from stage_memory import StageMemory, stage_marks

__all__ = ["step_compress", "compress_config"]


def compress_config(name: str, two_level_min_nodes: int = 20000):
    """The preset ``name`` as ``memforest compress --preset NAME --kmeans two-level --schedule matching``."""
    from memforest_gpu.config import preset

    cfg = preset(name)
    return dataclasses.replace(
        cfg, partition=dataclasses.replace(cfg.partition, kmeans="two-level", two_level_min_nodes=two_level_min_nodes),
        merge=dataclasses.replace(cfg.merge, schedule="matching"))


def step_compress(ctx: Ctx) -> None:
    from memforest_gpu.config import DEFAULT_PRESET
    from memforest_gpu.engine import compress

    s = ctx.size
    t0 = time.perf_counter()
    store = fast_store(s["compress_n"], s["compress_dim"], tenants=s["compress_tenants"], seed=1, device=ctx.dev)
    build_s = time.perf_counter() - t0
    warm = fast_store(2000, s["compress_dim"], tenants=2, seed=2, device=ctx.dev)
    for name in (DEFAULT_PRESET, "paper"):
        if ctx.left() < 15:
            ctx.emit(name=f"compress_{name}", status="skipped", summary="no time left in the step")
            continue
        cfg = compress_config(name, s["compress_two_level_min"])
        compress(warm, cfg, device=ctx.dev)  # warm-up: kernels, allocator
        _one(ctx, compress, store, cfg, name, build_s)
    del store
    small = fast_store(s["accounting_n"], s["compress_dim"], tenants=s["compress_tenants"], seed=3, device=ctx.dev)
    for name in (DEFAULT_PRESET, "paper"):
        if ctx.left() < 20:
            ctx.emit(name=f"accounting_{name}", status="skipped", summary="no time left in the step")
            continue
        _accounting(ctx, compress, small, compress_config(name, s["compress_two_level_min"]), name)


def _accounting(ctx: Ctx, compress, store, cfg, name: str) -> None:
    """Each stage's FLOPs and bytes against the device (:mod:`accounting`), one record."""
    res = compress(store, cfg, device=ctx.dev)
    acc = account(count_stages(lambda: compress(store, cfg, device=ctx.dev)), res.report.seconds, ctx.dev)
    stages = {k: v for k, v in acc.items() if isinstance(v, dict)}
    worst = min(stages, key=lambda k: stages[k]["efficiency_pct"] or 100.0) if stages else None
    ctx.emit(name=f"accounting_{name}", status="ok", n=len(store), preset=name,
             summary=f"{len(store):,} nodes: the stage farthest from the device is {worst} "
                     f"({stages[worst]['efficiency_pct'] or 0:.0f}% of its floor)" if worst else "no stage",
             accounting=acc, text_stages=text_stages(res.report.seconds, res.merges, res.store.texts))
    print(format_accounting(acc), flush=True)


def _one(ctx: Ctx, compress, store, cfg, name: str, build_s: float) -> None:
    from host_reads import count_host_reads  # tests/host_reads.py (gpu_steps.py puts tests/ on the path)

    from memforest_gpu.kernels.triton_assign import fallback_reasons

    per_round: list[tuple[int, int]] = []  # (reads, H2D copies) of each round
    ctx.reset_peak()
    ctx.sync()
    sm = StageMemory(echo=False)
    with count_host_reads() as reads, sm, stage_marks(sm):
        seen = [0, 0]

        def on_round(rnd, merges):
            per_round.append((reads.total - seen[0], reads.h2d - seen[1]))
            seen[:] = [reads.total, reads.h2d]

        t = time.perf_counter()
        res = compress(store, cfg, device=ctx.dev, on_round=on_round)
        ctx.sync()
        sec = time.perf_counter() - t
    r = res.report
    stages = {k: {f: round(v[f], 3) for f in ("seconds", "rss_peak_mb", "cuda_peak_mb") if f in v}
              for k, v in sm.summary()["stages"].items() if k not in ("startup", "exit")}
    shortfall = sum(row["shortfall"] for row in r.tenants)
    ok = shortfall == 0 and r.nodes_out == len(store) - sum(row["requested"] for row in r.tenants)
    rounds_max = max((x for x, _ in per_round[1:]), default=None)
    ctx.emit(name=f"compress_{name}", status="ok" if ok else "fail",
             summary=f"{sec:.1f} s for {len(store):,} nodes -> {r.nodes_out:,} in {r.rounds} rounds, peak "
                     f"{_mb(ctx.peak_mb())} device, {reads.total:,} host reads + {reads.h2d:,} H2D copies",
             n=len(store), dim=store.dim, tenants=len(store.tenant_names()), preset=name,
             kmeans=cfg.partition.kmeans, schedule=cfg.merge.schedule, seconds=sec,
             **{f"{k}_s": v for k, v in r.seconds.items()}, rounds=r.rounds, merges=r.merges, trees=r.trees,
             nodes_out=r.nodes_out, shortfall=shortfall, peak_gpu_mb=ctx.peak_mb(), stages=stages,
             host_reads=reads.total, host_reads_by_name=dict(reads.by_name.most_common()), h2d_copies=reads.h2d,
             copies_by_name=dict(reads.copies.most_common()), reads_per_round=[x for x, _ in per_round],
             h2d_per_round=[y for _, y in per_round], max_reads_per_round_after_first=rounds_max,
             store_build_s=build_s, triton_fallbacks=fallback_reasons())


def _mb(v) -> str:
    return "n/a (CPU)" if v is None else f"{v / 1024:.1f} GiB"


if __name__ == "__main__":  # a module the benchmarks import: run alone, it only explains itself
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog="Imported by other bench/ scripts (bench/README.md); it runs nothing "
                                   "by itself.").parse_args()
