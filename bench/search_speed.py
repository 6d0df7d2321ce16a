"""Search queries/s of an uncompressed store against its compressed store, same queries, same
run, interleaved; and the uncompressed search against the machine's floor.

The stores: ``--input`` / ``--output`` files (a compression of the input), or, without them, a
synthetic store of ``--nodes`` over ``--tenants`` (1,000 a user by default) compressed here to
``--ratio`` by the ``--preset`` (mean vectors: no model is loaded). ``--queries`` queries, each
for a random tenant, k = 10, plain top-k and AGPR; each store searched by the shipped
:class:`~memforest_gpu.retrieval.retriever.Retriever` (the compressed one by its rule: text and
best key when it has keys; and by its text alone, for comparison). Best of ``--repeat`` runs,
the three stores' runs interleaved.

The floor: the uncompressed search's products (Q x n_tenant x D multiply-adds) at the rate of one
large ``torch.mm`` on this machine (``--floor-shape``); efficiency = floor time / search time.

    python bench/search_speed.py --nodes 200000 --tenants 200 --queries 4096 --out runs/search_speed.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import print_hardware  # noqa: E402

from memforest_gpu import RetrievalConfig, Retriever  # noqa: E402
from memforest_gpu.cli.commands import main as cli  # noqa: E402
from memforest_gpu.store.io import read_store, write_store  # noqa: E402
from memforest_gpu.store.synthetic import synthetic_store  # noqa: E402


def mm_rate(m: int = 4096, n: int = 4096, d: int = 384, reps: int = 5) -> float:
    """Multiply-adds per second of one large float32 matrix product."""
    a, b = torch.randn(m, d), torch.randn(d, n)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(reps))
    return m * n * d / best


def _timed(f) -> float:
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def stores(a) -> tuple:
    if a.input:
        return read_store(a.input), read_store(a.output)
    tmp = tempfile.mkdtemp(prefix="search_speed_")
    src, dst = os.path.join(tmp, "in.parquet"), os.path.join(tmp, "out.parquet")
    write_store(synthetic_store(a.nodes, tenants=a.tenants, seed=0), src)
    assert cli(["compress", src, dst, "--ratio", str(a.ratio), "--preset", a.preset, "--embedder", "none",
                "--quiet"]) == 0
    return read_store(src), read_store(dst)


def random_queries(store, n: int) -> tuple[list[str], torch.Tensor]:
    """``n`` random unit queries, each for a random tenant of ``store`` (seeded).
    Shape: -> tenants (n,), queries (n, D)"""
    names = store.tenant_names()
    ten = [names[i] for i in np.random.default_rng(0).integers(0, len(names), n)]
    q = torch.nn.functional.normalize(torch.randn(n, store.dim, generator=torch.Generator().manual_seed(0)), dim=1)
    return ten, q


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input")
    ap.add_argument("--output")
    ap.add_argument("--nodes", type=int, default=200_000)
    ap.add_argument("--tenants", type=int, default=200)
    ap.add_argument("--ratio", type=float, default=0.5)
    ap.add_argument("--preset", default="memforest")
    ap.add_argument("--queries", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default="runs/search_speed.json")
    a = ap.parse_args(argv)
    print_hardware()
    inp, out = stores(a)
    text = dataclasses.replace(out)
    text.keys = None
    ten, q = random_queries(inp, a.queries)
    rs = {"uncompressed": Retriever(inp), "compressed": Retriever(out), "compressed, text only": Retriever(text)}
    sizes = np.bincount(inp.tenant_codes_np)
    macs = float(sum(sizes[inp.tenant_names().index(t)] for t in ten)) * inp.dim  # the uncompressed search
    rate = mm_rate()
    recs = []
    for agpr in (False, True):
        cfg = RetrievalConfig(k=10, agpr=agpr)
        for r in rs.values():
            r.search(q[:256], tenants=ten[:256], config=cfg)  # warm-up
        best = dict.fromkeys(rs, float("inf"))
        for _ in range(a.repeat):
            for name, r in rs.items():
                best[name] = min(best[name], _timed(lambda r=r: r.search(q, tenants=ten, config=cfg)))
        for name in rs:
            rec = {"search": "agpr" if agpr else "top-k", "store": name, "queries": a.queries,
                   "nodes": len(inp) if name == "uncompressed" else len(out),
                   "key_rows": int(out.keys.vectors.shape[0]) if name == "compressed" and out.keys is not None else 0,
                   "qps": a.queries / best[name], "vs_uncompressed": best["uncompressed"] / best[name]}
            if name == "uncompressed":
                rec["floor_s"] = macs / rate
                rec["efficiency"] = macs / rate / best[name]
            recs.append(rec)
            print(json.dumps(rec), flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"mm_macs_per_s": rate, "records": recs}, f, indent=1)


if __name__ == "__main__":
    main()
