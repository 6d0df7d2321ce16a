"""Time per stage against store size, on synthetic memory-like stores.

Stores have clustered embeddings with temporal drift. Two tenant shapes:

- ``few`` (default): ``--tenants`` 8, one big tenant holding ``--big-share`` of the nodes;
- ``many``: ``--tenants`` (default min(100,000, N/10)) with heavy-tailed sizes (most under
  50 nodes, a few over 5,000 at 1M nodes; :func:`memforest_gpu.store.synthetic.heavy_tailed_sizes`).

Merging uses the extractive (non-LLM) merger and mean embeddings (re-embedding excluded)
unless ``--reembed`` is given.

In-process mode times ``compress`` alone (peak RSS of the compression, and by stage). ``--cli`` writes
each store to Parquet in record batches (under ``--workdir``, reused when already there)
and runs ``memforest compress`` as a child process, reporting its wall time and
whole-process peak RSS (``/usr/bin/time -v``), with ``--memory-budget`` passed through; the
child runs under ``bench/stage_memory.py``, so the record also holds each stage's time,
resident set and peak (``stages``) and the stage that set the whole-process peak
(``peak_stage``).
One JSON record per run.

    python bench/scaling.py --sizes 1000,10000,100000 --out runs/scaling.json --plot runs/scaling.png
    python bench/scaling.py --sizes 1000000 --kmeans two-level --schedule matching
    python bench/scaling.py --cli --tenants-shape many --sizes 1000000 --kmeans two-level --schedule matching
    python bench/scaling.py --cli --tenants-shape many --sizes 5000000 --memory-budget 4G --kmeans two-level
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from accounting import account, count_stages, format_accounting, text_stages  # noqa: E402
from common import Timer, peak_rss_mb, print_hardware, reset_peak, run_measured, write_records  # noqa: E402
from stage_memory import StageMemory, stage_marks  # noqa: E402

from memforest_gpu import CompressConfig, compress  # noqa: E402
from memforest_gpu.store.synthetic import few_tenant_sizes, heavy_tailed_sizes, synthetic_store, write_synthetic_parquet  # noqa: E402

STAGES = ("partition", "setup", "plan", "merge", "embed", "apply", "output")
OUTSIDE_ROUNDS = ("partition", "setup", "output", "total")


def stage_seconds(seconds: dict) -> dict:
    """``{stage}_s`` for every stage the report has (older versions book plan and apply as
    ``trees``), and ``rounds_s``: every stage of the merge rounds together."""
    out = {f"{k}_s": v for k, v in seconds.items() if k != "total"}
    out["rounds_s"] = sum(v for k, v in seconds.items() if k not in OUTSIDE_ROUNDS)
    return out


def tenant_sizes(n: int, a):
    """The tenant sizes of an ``n``-node store of shape ``a.tenants_shape``. Shape: -> (T,)"""
    if a.tenants_shape == "many":
        t = a.tenants if a.tenants is not None else min(100_000, max(1, n // 10))
        return heavy_tailed_sizes(n, min(t, n), seed=n)
    return few_tenant_sizes(n, min(a.tenants if a.tenants is not None else 8, n), a.big_share)


def store_file(n: int, a) -> str:
    """A Parquet store of ``n`` nodes in ``a.workdir`` (written in record batches; reused)."""
    sizes = tenant_sizes(n, a)
    name = f"{a.tenants_shape}-n{n}-t{len(sizes)}-d{a.dim}" + (f"-b{a.big_share}" if a.tenants_shape == "few" else "")
    path = os.path.join(a.workdir, name + ".parquet")
    if not os.path.exists(path):
        os.makedirs(a.workdir, exist_ok=True)
        t = time.perf_counter()
        write_synthetic_parquet(path, sizes, dim=a.dim, seed=n)
        print(f"# wrote {path} ({len(sizes)} tenants) in {time.perf_counter() - t:.1f}s", flush=True)
    return path


def run_cli(n: int, a) -> dict:
    src = store_file(n, a)
    out = os.path.join(a.workdir, f"out-{os.getpid()}.parquet")
    report, stages = out + ".report.json", out + ".stages.json"
    for p in (out, report, stages):
        if os.path.exists(p):
            os.unlink(p)
    cmd = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "stage_memory.py"), "--out",
           stages, "--", "compress", src, out, "--ratio", str(a.ratio), "--schedule", a.schedule, "--kmeans",
           a.kmeans, "--embedder", "default" if a.reembed else "none", "--report", report]
    if a.device:
        cmd += ["--device", a.device]
    if a.memory_budget:
        cmd += ["--memory-budget", a.memory_budget]
    if a.preset:
        cmd += ["--preset", a.preset]
    if a.keys is not None:
        cmd += ["--keys", a.keys]
    if a.vectors is not None:
        cmd += ["--vectors", a.vectors]
    m = run_measured(cmd)
    rec = {"bench": "scaling-cli", "n": n, "dim": a.dim, "tenants_shape": a.tenants_shape,
           "tenants": int(len(tenant_sizes(n, a))), "kmeans": a.kmeans, "schedule": a.schedule, "ratio": a.ratio,
           "reembed": a.reembed, "memory_budget": a.memory_budget, "preset": a.preset or "memforest (CLI default)",
           "keys": a.keys if a.keys is not None else "the preset's",
           "vectors": a.vectors if a.vectors is not None else "the preset's",
           "seconds": m["seconds"],
           "peak_rss_mb": m["peak_rss_mb"], "peak_source": m["peak_source"], "returncode": m["returncode"]}
    if m["returncode"] != 0:
        rec["error"] = m["output_tail"]
        print(m["output_tail"], file=sys.stderr)
    else:
        with open(report) as f:
            r = json.load(f)
        rec.update(nodes_out=r["nodes_out"], shortfall=r["shortfall"], rounds=r["rounds"], trees=r["trees"],
                   **stage_seconds(r["seconds"]))
        groups = [ln for ln in m["output"].splitlines() if ln.startswith("memory budget")]
        if groups:
            rec["budget_groups"] = groups[-1]
        with open(stages) as f:
            st = json.load(f)
        rec.update(stages=st["stages"], peak_stage=st["peak_stage"])
        print("\n".join(ln for ln in m["output"].splitlines() if ln.startswith("# stage")), flush=True)
    for p in (out, report, stages):
        if os.path.exists(p):
            os.unlink(p)
    print(f"n={n:>8} {a.tenants_shape} cli total {m['seconds']:8.2f}s  peak {m['peak_rss_mb']:.0f} MB "
          f"({m['peak_source']})  rc {m['returncode']}", flush=True)
    if a.json_lines:
        print(json.dumps(rec), flush=True)
    return rec


def run_in_process(n: int, a, cfg, embedder) -> dict:
    if a.tenants_shape == "many":
        from memforest_gpu.store.io import read_store

        store = read_store(store_file(n, a), device=a.device)
    else:
        store = synthetic_store(n, tenants=min(a.tenants or 8, n), dim=a.dim if not a.reembed else 384,
                                big_tenant_share=a.big_share, seed=n, device=a.device)
    store_mb = peak_rss_mb()
    reset_peak()  # peak of the compression itself, not of building the synthetic store
    sm = StageMemory(echo=False)
    cpu0 = time.process_time()
    with Timer() as t, sm, stage_marks(sm):
        res = compress(store, cfg, embedder=embedder, device=a.device)
    cpu = time.process_time() - cpu0
    sec = res.report.seconds
    rec = {"bench": "scaling", "n": n, "dim": store.dim, "tenants_shape": a.tenants_shape,
           "tenants": len(store.tenant_names()), "kmeans": a.kmeans, "schedule": a.schedule, "ratio": a.ratio,
           "preset": a.preset or "paper", "keys": getattr(cfg.merge, "keys", 0), "threads": torch.get_num_threads(),
           "reembed": a.reembed, "seconds": t.seconds, "cpu_s": cpu, "peak_mb": peak_rss_mb(),
           "store_build_peak_mb": store_mb, "rounds": res.report.rounds, "trees": res.report.trees,
           "nodes_out": res.report.nodes_out, "shortfall": res.report.shortfall, **stage_seconds(sec),
           "stages": {k: v for k, v in sm.summary()["stages"].items() if k not in ("startup", "exit")}}
    print(f"n={n:>8} total {t.seconds:8.2f}s  " + "  ".join(f"{k} {v:.2f}" for k, v in sec.items() if k != "total")
          + f"  rounds {res.report.rounds}  peak {rec['peak_mb']:.0f} MB", flush=True)
    if a.accounting:
        rec["accounting"] = account(count_stages(lambda: compress(store, cfg, embedder=embedder, device=a.device)),
                                    sec, store.device)
        rec["text_stages"] = text_stages(sec, res.merges, res.store.texts)
        print(format_accounting(rec["accounting"]), flush=True)
        print("# text stages: " + json.dumps({k: {kk: round(vv, 2) for kk, vv in v.items() if vv is not None}
                                               for k, v in rec["text_stages"].items()}), flush=True)
    if a.json_lines:
        print(json.dumps(rec), flush=True)
    return rec


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,3000,10000,30000,100000")
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--tenants-shape", default="few", choices=("few", "many"),
                    help="few: --tenants (8) with one big tenant; many: --tenants (min(100000, N/10)) heavy-tailed")
    ap.add_argument("--tenants", type=int, default=None, help="tenants (default: 8 for few, min(100000, N/10) many)")
    ap.add_argument("--big-share", type=float, default=0.5, help="few: fraction of nodes in the one big tenant")
    ap.add_argument("--ratio", type=float, default=0.5)
    ap.add_argument("--schedule", default="sequential")
    ap.add_argument("--kmeans", default="exact", help="exact | two-level")
    ap.add_argument("--device", default=None)
    ap.add_argument("--reembed", action="store_true", help="re-embed merged text with all-MiniLM-L6-v2")
    ap.add_argument("--cli", action="store_true",
                    help="run `memforest compress` on a Parquet store as a child process (whole-process peak RSS)")
    ap.add_argument("--memory-budget", default=None, help="--cli: passed to memforest compress")
    ap.add_argument("--preset", default=None,
                    help="the preset the run starts from; --kmeans and --schedule still apply (default: paper "
                         "in process, the CLI's, memforest, with --cli)")
    ap.add_argument("--keys", default=None,
                    help="keys of merged nodes (0, K or all; default: the preset's); a revision without keys "
                         "(bench/compare.py) takes only 0")
    ap.add_argument("--vectors", default=None, help="--cli: float32 | int8, how the output holds its vectors "
                    "(default: the preset's)")
    ap.add_argument("--threads", type=int, default=0, help="in process: torch CPU threads (default 0: torch's)")
    ap.add_argument("--accounting", action="store_true",
                    help="in process: run once more counting every stage's FLOPs and bytes, and print them against "
                         "torch.mm and a copy on this machine (bench/accounting.py)")
    ap.add_argument("--json-lines", action="store_true",
                    help="print each record as one JSON line (what bench/compare.py reads)")
    ap.add_argument("--workdir", default="/tmp/memforest-scaling", help="--cli / many: where stores are written")
    ap.add_argument("--out", default="runs/scaling.json")
    ap.add_argument("--plot", default=None)
    a = ap.parse_args(argv)
    if a.memory_budget and not a.cli:
        ap.error("--memory-budget needs --cli (it is an option of memforest compress)")
    print_hardware()
    records = []
    sizes = [int(x) for x in a.sizes.split(",")]
    if a.cli:
        for n in sizes:
            records.append(run_cli(n, a))
        write_records(a.out, records)
        return
    embedder = None
    if a.reembed:
        from memforest_gpu import SentenceTransformerEmbedder

        embedder = SentenceTransformerEmbedder(device=a.device)
    if a.threads:
        torch.set_num_threads(a.threads)
    base = CompressConfig.preset(a.preset) if a.preset else CompressConfig()
    cfg = dataclasses.replace(
        base, partition=dataclasses.replace(base.partition, kmeans=a.kmeans, two_level_min_nodes=20000),
        merge=dataclasses.replace(base.merge, ratio=a.ratio, schedule=a.schedule))
    if a.keys is not None and (hasattr(cfg.merge, "keys") or a.keys != "0"):
        keys = -1 if a.keys == "all" else int(a.keys)
        cfg = dataclasses.replace(cfg, merge=dataclasses.replace(cfg.merge, keys=keys))
    compress(synthetic_store(500, tenants=2, dim=a.dim if not a.reembed else 384), cfg, device=a.device)  # warm-up
    for n in sizes:
        records.append(run_in_process(n, a, cfg, embedder))
    write_records(a.out, records)
    if a.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        ns = [r["n"] for r in records]
        for s in ("partition", "rounds"):
            ax.plot(ns, [max(r[f"{s}_s"], 1e-3) for r in records], marker="o", label=s)
        ax.plot(ns, [r["seconds"] for r in records], marker="s", color="black", label="total")
        ax.set_xscale("log"), ax.set_yscale("log"), ax.set_xlabel("nodes"), ax.set_ylabel("seconds")
        ax.set_title(f"memforest compress, {a.kmeans} k-means, {a.schedule}")
        ax.legend(), fig.tight_layout(), fig.savefig(a.plot, dpi=120)
        print(f"# wrote {a.plot}")


if __name__ == "__main__":
    main()
