"""compact against the size of the store: what one compaction costs when a few memories arrive.

``tenant``: one tenant of ``--nodes`` memories, compressed once by ``compress`` (its trees
recorded), receives ``--new`` memories (the latest ones of the same synthetic walk) and is
compacted back to ``--nodes`` (budget ``--nodes``, low water 1.0: exactly ``--new``
removals). Times ``compact`` on the in-memory store and ``compact_file`` on its Parquet file.

    python bench/compact.py tenant --nodes 100000 --new 100 --preset memforest

``many``: a store of ``--nodes`` memories over ``--tenants`` heavy-tailed tenants (bench/
scaling.py's ``many`` shape) compressed by ``memforest compress`` (timed, the reference);
``--share`` of the tenants then receive ``--new`` memories each (the inbox), every tenant's
budget is its size after compress (low water 1.0), and ``compact_file`` is timed.

    python bench/compact.py many --nodes 1000000 --tenants 100000 --share 0.01 --preset paper

One line per configuration; ``--json`` writes the records.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import hardware, peak_rss_mb, print_hardware, run_measured  # noqa: E402

from memforest_gpu import CompressConfig, compress, write_store  # noqa: E402
from memforest_gpu.config import CompactConfig  # noqa: E402
from memforest_gpu.engine.compaction import compact  # noqa: E402
from memforest_gpu.runs.compact_run import compact_file  # noqa: E402
from memforest_gpu.runs.inbox_files import inbox_path  # noqa: E402
from memforest_gpu.store.splice import append  # noqa: E402
from memforest_gpu.store.synthetic import heavy_tailed_sizes, synthetic_store, write_synthetic_parquet  # noqa: E402


def _cfg(preset: str, ratio: float) -> CompressConfig:
    import dataclasses

    c = CompressConfig.preset(preset)
    return dataclasses.replace(c, merge=dataclasses.replace(c.merge, ratio=ratio))


def tenant(a) -> dict:
    raw = synthetic_store(a.nodes + 1 + a.new, dim=a.dim, seed=0)
    order = np.argsort(raw.timestamps.numpy(), kind="stable")
    old, new = raw.take(np.sort(order[:-a.new])), raw.take(np.sort(order[-a.new:]))
    cached = os.path.join(a.workdir, f"tenant-{a.preset}-{a.nodes}.parquet") if a.workdir else None
    t = time.perf_counter()
    if cached and os.path.exists(cached):
        from memforest_gpu import read_store

        base, t_base = read_store(cached), None
    else:
        base = compress(old, _cfg(a.preset, 1.0 / (a.nodes + 1)), device=a.device).store  # removes 1: trees recorded
        t_base = time.perf_counter() - t
        if cached:
            write_store(base, cached)
    grown = append(base, new)
    budget = CompactConfig(max_nodes=a.nodes, low_water=1.0)
    compact(append(base.take(np.arange(2000)), new.take(np.arange(10))), CompactConfig(max_nodes=2000, low_water=1.0),
            CompressConfig.preset(a.preset), device=a.device)  # warm-up
    t = time.perf_counter()
    res = compact(grown, budget, CompressConfig.preset(a.preset), device=a.device)
    sec = time.perf_counter() - t
    r = res.report.tenants[0]
    rec = {"mode": "tenant", "preset": a.preset, "nodes": a.nodes, "new": a.new, "compact_seconds": sec,
           "stages": res.report.seconds, "merges": res.report.merges, "trees": r["trees"],
           "trees_replanned": r["trees_replanned"], "placed": r["placed"], "new_trees": r["new_trees"],
           "nodes_out": len(res.store), "compress_seconds": t_base}
    with tempfile.TemporaryDirectory(prefix="compact-bench-") as d:
        path = os.path.join(d, "store.parquet")
        write_store(base, path)
        with open(inbox_path(path), "w") as f:
            for rec_ in new.records():
                f.write(json.dumps(rec_) + "\n")
        t = time.perf_counter()
        fr = compact_file(path, budget, CompressConfig.preset(a.preset), embedder="none")
        rec["compact_file_seconds"] = time.perf_counter() - t
        rec["compact_file_steps"] = fr.seconds
    print(f"tenant  preset {a.preset:<9} {a.nodes} + {a.new} new: compact {sec:.2f}s in memory "
          f"({r['trees_replanned']} of {r['trees']} trees re-planned, {r['placed']} placed, "
          f"{r['new_trees']} new trees, "
          f"{res.report.merges} merges), {rec['compact_file_seconds']:.2f}s on the Parquet file "
          f"({', '.join(f'{k} {v:.2f}s' for k, v in fr.seconds.items())})"
          + (f"; compress of the tenant {t_base:.1f}s" if t_base else ""),
          flush=True)
    return rec


def many(a) -> dict:
    work = a.workdir or tempfile.mkdtemp(prefix="compact-many-")
    os.makedirs(work, exist_ok=True)
    sizes = heavy_tailed_sizes(a.nodes, a.tenants, seed=a.nodes)
    src = os.path.join(work, f"many-n{a.nodes}-t{a.tenants}-d{a.dim}.parquet")
    if not os.path.exists(src):
        write_synthetic_parquet(src, sizes, dim=a.dim, seed=a.nodes)
    out = os.path.join(work, f"compressed-{a.preset}.parquet")
    rec = {"mode": "many", "preset": a.preset, "nodes": a.nodes, "tenants": a.tenants, "share": a.share, "new": a.new}
    if not (a.reuse and os.path.exists(out)):
        if os.path.exists(out):
            os.unlink(out)
        cmd = [sys.executable, "-m", "memforest_gpu.cli", "compress", src, out, "--preset", a.preset,
               "--embedder", "none", "--quiet", "--kmeans", "two-level"]
        m = run_measured(cmd)
        if m["returncode"]:
            raise SystemExit(m["output_tail"])
        rec["compress_seconds"], rec["compress_peak_rss_mb"] = m["seconds"], m["peak_rss_mb"]
        print(f"many    preset {a.preset:<9} memforest compress of {a.nodes} nodes / {a.tenants} tenants: "
              f"{m['seconds']:.1f}s, {m['peak_rss_mb']:.0f} MB", flush=True)
    store_path = os.path.join(work, "compacted.parquet")
    import shutil

    shutil.copy(out, store_path)
    from memforest_gpu.runs.compact_files import PassThrough

    counts = PassThrough(store_path).tenant_counts()
    names = sorted(counts)
    rng = np.random.default_rng(0)
    chosen = rng.choice(len(names), size=max(1, int(round(a.share * len(names)))), replace=False)
    with open(inbox_path(store_path), "w") as f:
        for j in chosen.tolist():
            s = synthetic_store(a.new, dim=a.dim, seed=j, start=2.0e9)
            for i, r in enumerate(s.records()):
                f.write(json.dumps({**r, "id": f"{names[j]}-late-{i}", "tenant": names[j], "sources": None}) + "\n")
    budget = CompactConfig(max_nodes=dict(counts), low_water=1.0)
    m = run_measured([sys.executable, os.path.abspath(__file__), "_compact_file", store_path, a.preset])
    if m["returncode"]:
        raise SystemExit(m["output_tail"])
    # the child's JSON line (its output also holds /usr/bin/time's report)
    got = json.loads([ln for ln in m["output"].splitlines() if ln.startswith("{")][-1])
    rec.update({"compact_seconds": m["seconds"], "compact_peak_rss_mb": m["peak_rss_mb"], **got,
                "tenants_with_new": len(chosen)})
    del budget
    ref = rec.get("compress_seconds")
    print(f"many    preset {a.preset:<9} compact after {a.new} new memories in {len(chosen)} tenants: "
          f"{m['seconds']:.1f}s wall, {m['peak_rss_mb']:.0f} MB ({got['steps']})"
          + (f"; {m['seconds'] / ref:.1%} of compress" if ref else ""),
          flush=True)
    return rec


def _compact_file(path: str, preset: str) -> None:
    """The child process of ``many``: compact_file with every tenant's budget its size now."""
    from memforest_gpu.runs.compact_files import PassThrough

    counts = PassThrough(path).tenant_counts()
    r = compact_file(path, CompactConfig(max_nodes=counts, low_water=1.0), CompressConfig.preset(preset),
                     embedder="none")
    print(json.dumps({"steps": {k: round(v, 2) for k, v in r.seconds.items()}, "merges": r.report.merges,
                      "compacted_tenants": len(r.report.tenants), "peak_rss_mb_self": peak_rss_mb()}))


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_compact_file":
        _compact_file(sys.argv[2], sys.argv[3])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["tenant", "many"])
    ap.add_argument("--nodes", type=int, default=100_000)
    ap.add_argument("--new", type=int, default=100, help="memories that arrive (tenant), per chosen tenant (many)")
    ap.add_argument("--tenants", type=int, default=100_000)
    ap.add_argument("--share", type=float, default=0.01, help="many: share of tenants that receive memories")
    ap.add_argument("--preset", default="memforest")
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workdir", default=None, help="where the stores are written (reused)")
    ap.add_argument("--reuse", action="store_true", help="many: reuse a compressed store in --workdir")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print_hardware()
    rec = {"hardware": hardware(), **(tenant(a) if a.mode == "tenant" else many(a))}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rec, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
