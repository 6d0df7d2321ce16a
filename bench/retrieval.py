"""Retrieval latency and throughput: plain top-k vs AGPR, against store size, and the
search speedup after 30/50/70% compression (same index type, same queries, one run).

    python bench/retrieval.py --sizes 10000,100000 --queries 1000 --out runs/retrieval.json

Many tenants (``--many-tenants``): a store of ``--many-nodes`` nodes over that many tenants with
heavy-tailed sizes (Pareto, most under 50 nodes, a few over 5,000), rows interleaved; 1,000
queries, each for its own tenant (tenants drawn by size, without replacement); queries/s for
plain top-k and AGPR. ``--many-compress``: the store is first compressed in-process
(``--kmeans``, matching schedule, ratio 0.5) and searched after; prints the stage times of
``report.seconds``, the peak RSS and each tenant's exact removal.

Merged nodes' keys (``--keys K``, ``--text-weight W``; store/keys.py): with ``--many-compress``
the compression keeps them (``merge.keys = K``); without it, ``--keyed-share`` of the nodes
(default 0.5, a store compressed to half) get ``K`` synthetic keys each (vectors near the
node's own). The same store is then searched by today's rule (its keys dropped) and by the
keys' rule, in the same process, and the ratio of their queries/s is printed.

    python bench/retrieval.py --many-tenants 100000 --many-nodes 500000
    python bench/retrieval.py --many-tenants 100000 --many-nodes 500000 --keys 3 --text-weight 0.5
    python bench/retrieval.py --many-tenants 100000 --many-nodes 500000 --many-compress --keys all
    python bench/retrieval.py --many-tenants 20000 --many-nodes 200000 --many-compress
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import time  # noqa: E402

import numpy as np  # noqa: E402
from common import Timer, peak_rss_mb, print_hardware, write_records  # noqa: E402

from memforest_gpu import CompressConfig, MergeConfig, RetrievalConfig, Retriever, compress  # noqa: E402
from memforest_gpu.cli.flags import keys_count  # noqa: E402
from memforest_gpu.config import PartitionConfig  # noqa: E402
from memforest_gpu.engine.quotas import removal_target  # noqa: E402
from memforest_gpu.store.keys import NodeKeys  # noqa: E402
from memforest_gpu.store.memory_store import MemoryStore  # noqa: E402
from memforest_gpu.store.synthetic import synthetic_store  # noqa: E402


def heavy_tailed_sizes(n: int, tenants: int, *, seed: int = 0, cap: int = 20000) -> np.ndarray:
    """Tenant sizes summing to ``n``: Pareto (shape 1.1) capped at ``cap``, scaled; most
    tenants under 50 nodes, a few over 5,000. Shape: -> (tenants,) int64"""
    rng = np.random.default_rng(seed)
    s = np.minimum(rng.pareto(1.1, tenants) + 1, cap)
    s = np.maximum(1, np.round(s * n / s.sum())).astype(np.int64)
    s[np.argmax(s)] += n - s.sum()  # exact total (the largest tenant absorbs the rounding)
    return s


def many_tenant_store(n: int, tenants: int, dim: int, *, seed: int = 0, device=None) -> MemoryStore:
    """``n`` nodes over ``tenants`` tenants of heavy-tailed sizes, rows interleaved: each tenant
    a few topics (its vectors near them), random times. Shape: -> MemoryStore (n, dim)"""
    rng = np.random.default_rng(seed)
    sizes = heavy_tailed_sizes(n, tenants, seed=seed)
    code = np.repeat(np.arange(tenants), sizes)
    topic = rng.integers(0, 4, n)
    centres = rng.standard_normal((tenants, 4, dim), dtype=np.float32)
    E = centres[code, topic]
    E += 0.6 * rng.standard_normal((n, dim), dtype=np.float32)
    perm = rng.permutation(n)
    E = torch.from_numpy(E[perm])
    code = code[perm]
    ts = (1.6e9 + rng.random(n) * 3e7).tolist()
    return MemoryStore.from_columns(ids=[f"m{i}" for i in range(n)], texts=[f"memory {i} of user {c}." for i, c in
                                                                          enumerate(code.tolist())],
                                    timestamps=ts, embeddings=E, tenants=[f"user-{c}" for c in code.tolist()],
                                    device=device)


def synthetic_keys(store: MemoryStore, k: int, text_weight: float, share: float, *, seed: int = 0) -> NodeKeys:
    """``k`` keys for a ``share`` of the nodes (drawn at random), each its node's vector plus
    noise, normalised: the shape of a store compressed to about ``1 - share`` of its nodes.
    Shape: -> NodeKeys of len(store) nodes, about share * N * k keys"""
    rng = np.random.default_rng(seed)
    N, D = len(store), store.dim
    counts = np.where(rng.random(N) < share, k, 0)
    owner = np.repeat(np.arange(N), counts)
    base = store.embeddings.detach().cpu()[torch.as_tensor(owner)]
    noise = torch.from_numpy(rng.standard_normal((len(owner), D)).astype(np.float32))
    vec = torch.nn.functional.normalize(base + 0.05 * noise, dim=1).to(store.device)
    ids = np.asarray(store.ids.arrow.to_numpy(zero_copy_only=False))[owner]
    return NodeKeys.from_lists(counts, vec, [[i] for i in ids.tolist()], text_weight=text_weight,
                               max_keys=k)


def _rule_stores(store: MemoryStore, a) -> list[tuple[str, MemoryStore]]:
    """(rule, store) pairs to search: the store as it is, and with keys the same store without them."""
    if a.keys and store.keys is None:
        if a.keys < 1:
            raise ValueError(f"--keys must be an integer >= 1 without --many-compress, got {a.keys!r}")
        store.keys = synthetic_keys(store, a.keys, a.text_weight, a.keyed_share)
    if store.keys is None:
        return [("text", store)]
    bare = MemoryStore(store.ids, store.texts, store.embeddings, store.timestamps, store.tenants, store.sources,
                       store.metadata, store.embedder)
    print(f"keys: {len(store.keys.vectors):,} over {int((store.keys.counts > 0).sum()):,} nodes "
          f"({(len(store) + len(store.keys.vectors)) / len(store):.2f} vectors per node), text weight "
          f"{store.keys.text_weight}", flush=True)
    k = "all" if a.keys == -1 else a.keys
    return [("text", bare), (f"keys{k}/w{store.keys.text_weight:g}", store)]


def many_tenants(a) -> list[dict]:
    records = []
    t0 = time.perf_counter()
    store = many_tenant_store(a.many_nodes, a.many_tenants, a.dim, seed=1, device=a.device)
    sizes = heavy_tailed_sizes(a.many_nodes, a.many_tenants, seed=1)
    print(f"store: {len(store):,} nodes, {a.many_tenants:,} tenants (median {int(np.median(sizes))}, "
          f"{(sizes < 50).mean():.1%} under 50, {(sizes > 5000).sum()} over 5,000, largest {sizes.max():,}); "
          f"made in {time.perf_counter() - t0:.1f} s", flush=True)
    if a.many_compress:
        cfg = CompressConfig(partition=PartitionConfig(kmeans=a.kmeans, two_level_min_nodes=a.two_level_min),
                             merge=MergeConfig(ratio=0.5, schedule="matching", keys=a.keys,
                                               text_weight=a.text_weight if a.keys else 1.0))
        with Timer() as t:
            res = compress(store, cfg, device=a.device)
        rep = res.report
        exact = sum(r["removed"] == r["requested"] for r in rep.tenants)
        short = sum(r["shortfall"] > 0 for r in rep.tenants)
        ok = all(r["removed"] == r["requested"] - r["shortfall"] for r in rep.tenants) and all(
            r["requested"] == removal_target(r["nodes_in"], 0.5) for r in rep.tenants)
        secs = {k: round(v, 2) for k, v in rep.seconds.items()}
        print(f"compress: {t.seconds:.1f} s wall, peak RSS {peak_rss_mb():,.0f} MB, {rep.nodes_in:,} -> "
              f"{rep.nodes_out:,} nodes, {rep.trees:,} trees, {rep.rounds} rounds; {exact:,} tenants exact, "
              f"{short:,} with a reported shortfall ({rep.shortfall:,} nodes), every tenant round(0.5 n) or "
              f"its shortfall: {ok}; stages {secs}", flush=True)
        records.append({"bench": "many-tenants-compress", "n": rep.nodes_in, "tenants": a.many_tenants,
                        "dim": a.dim, "kmeans": a.kmeans, "two_level_min_nodes": a.two_level_min, "seconds": t.seconds,
                        "stages": rep.seconds,
                        "peak_rss_mb": peak_rss_mb(), "nodes_out": rep.nodes_out, "shortfall": rep.shortfall,
                        "exact_or_reported": ok})
        store = res.store
        del res
    names, codes = store.tenant_index()
    size = torch.bincount(codes.cpu(), minlength=len(names)).double()
    g = torch.Generator().manual_seed(0)
    qt = torch.multinomial(size, a.queries, replacement=False, generator=g)  # distinct tenants, by size
    tens = [names[t] for t in qt.tolist()]
    q = torch.nn.functional.normalize(torch.randn(a.queries, a.dim, generator=g), dim=1).to(store.device)
    qps = {}
    for rule, st in _rule_stores(store, a):
        with Timer() as t:
            r = Retriever(st)
        print(f"retriever over {len(st):,} nodes, rule {rule}: built in {t.seconds * 1e3:.0f} ms", flush=True)
        for agpr in (False, True):
            cfg = RetrievalConfig(k=a.k, agpr=agpr)
            r.search(q[:8], tenants=tens[:8], config=cfg)  # warm-up
            best = float("inf")
            for _ in range(3):
                with Timer() as t:
                    r.search(q, tenants=tens, config=cfg)
                best = min(best, t.seconds)
            qps[rule, agpr] = a.queries / best
            print(f"{a.queries} queries, each its own tenant, rule {rule}, {'agpr' if agpr else 'topk'} k={a.k}: "
                  f"{best * 1e3:.1f} ms ({a.queries / best:,.0f} queries/s"
                  + (f", {qps['text', agpr] / qps[rule, agpr]:.2f}x slower than text)" if rule != "text" else ")"),
                  flush=True)
            records.append({"bench": "many-tenants-retrieval", "n": len(st), "tenants": len(names), "dim": a.dim,
                            "queries": a.queries, "k": a.k, "agpr": agpr, "seconds": best, "qps": a.queries / best,
                            "compressed": bool(a.many_compress), "rule": rule})
    return records


def _time_search(r: Retriever, q, cfg, reps: int = 3) -> float:
    r.search(q[:8], config=cfg)  # warm-up
    best = float("inf")
    for _ in range(reps):
        with Timer() as t:
            r.search(q, config=cfg)
        best = min(best, t.seconds)
    return best


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("-k", type=int, default=10)
    ap.add_argument("--ratios", default="0.3,0.5,0.7")
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", default="runs/retrieval.json")
    ap.add_argument("--many-tenants", type=int, default=0, help="many-tenant mode: this many tenants")
    ap.add_argument("--many-nodes", type=int, default=500_000)
    ap.add_argument("--many-compress", action="store_true", help="compress the many-tenant store first")
    ap.add_argument("--kmeans", default="two-level", help="partitioning of --many-compress")
    ap.add_argument("--two-level-min", type=int, default=PartitionConfig().two_level_min_nodes,
                    help="--many-compress: tenants from this size use two-level k-means")
    ap.add_argument("--keys", type=keys_count, default=0,
                    help="many-tenant mode: keys per merged node (0: none; all: every source, with --many-compress)")
    ap.add_argument("--text-weight", type=float, default=0.5, help="--keys: the text's weight in a node's score")
    ap.add_argument("--keyed-share", type=float, default=0.5,
                    help="--keys without --many-compress: share of the nodes given synthetic keys")
    a = ap.parse_args(argv)
    print_hardware()
    if a.many_tenants:
        write_records(a.out, many_tenants(a))
        return
    records = []
    for n in [int(x) for x in a.sizes.split(",")]:
        store = synthetic_store(n, dim=a.dim, seed=n, device=a.device)
        g = torch.Generator().manual_seed(0)
        q = store.embeddings[torch.randint(0, n, (a.queries,), generator=g).to(store.device)]
        q = torch.nn.functional.normalize(q + 0.3 * torch.randn(q.shape, generator=g).to(q.device), dim=1)
        base = {}
        for agpr in (False, True):
            cfg = RetrievalConfig(k=a.k, agpr=agpr)
            s = _time_search(Retriever(store), q, cfg)
            base[agpr] = s
            rec = {"bench": "retrieval", "n": n, "dim": a.dim, "queries": a.queries, "k": a.k, "agpr": agpr,
                   "ratio": 0.0, "seconds": s, "qps": a.queries / s, "speedup": 1.0}
            print(f"n={n:>8} ratio 0.0 {'agpr' if agpr else 'topk':>4}: {s * 1e3:8.1f} ms for {a.queries} queries "
                  f"({rec['qps']:9.0f} q/s)", flush=True)
            records.append(rec)
        for ratio in [float(x) for x in a.ratios.split(",")]:
            small = compress(store, CompressConfig(merge=MergeConfig(ratio=ratio, schedule="matching")),
                             device=a.device).store
            for agpr in (False, True):
                cfg = RetrievalConfig(k=a.k, agpr=agpr)
                s = _time_search(Retriever(small), q, cfg)
                rec = {"bench": "retrieval", "n": n, "dim": a.dim, "queries": a.queries, "k": a.k, "agpr": agpr,
                       "ratio": ratio, "nodes": len(small), "seconds": s, "qps": a.queries / s,
                       "speedup": base[agpr] / s}
                print(f"n={n:>8} ratio {ratio:.1f} {'agpr' if agpr else 'topk':>4}: {s * 1e3:8.1f} ms "
                      f"({rec['qps']:9.0f} q/s)  search speedup {rec['speedup']:.2f}x", flush=True)
                records.append(rec)
    write_records(a.out, records)


if __name__ == "__main__":
    main()
