"""``memforest``: a thin command line over the Python API. Each flag maps to a config field."""
from __future__ import annotations

import argparse
import json
import logging
import sys

__all__ = ["main", "build_parser"]


def _add_common_partition(p):
    p.add_argument("--alpha", type=float, default=0.05, help="clusters per node (K = floor(alpha*N))")
    p.add_argument("--beta", type=float, default=0.8, help="semantic weight in the reassignment")
    p.add_argument("--window", type=int, default=5, help="temporal window, in positions")
    p.add_argument("--eta", type=float, default=0.99, help="similarity weight in the degree-adjusted score")
    p.add_argument("--max-iter", type=int, default=30, help="at most this many Lloyd steps")
    p.add_argument("--degree-norm", default="none", help="none | max (the authors' code)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="memforest", description="Compress and search LLM-agent memory stores.")
    ap.add_argument("-v", "--verbose", action="store_true", help="log more")
    sub = ap.add_subparsers(dest="cmd", required=True)

    c = sub.add_parser("compress", help="compress a store (Parquet or JSONL) into a new file")
    c.add_argument("input")
    c.add_argument("output")
    c.add_argument("--ratio", type=float, default=0.5, help="fraction of each tenant's nodes to remove")
    c.add_argument("--schedule", default="sequential", help="sequential | matching")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--device", default=None, help="cpu | cuda (default: cuda when present)")
    _add_common_partition(c)
    c.add_argument("--embedder", default="auto",
                   help="auto (the store's recorded model) | default (all-MiniLM-L6-v2) | none (mean) | PATH")
    c.add_argument("--merger", default="extractive", help="extractive")
    c.add_argument("--max-node-tokens", type=int, default=None, help="cap on merged node length (default: embedder's)")
    c.add_argument("--format", default=None, help="input format: parquet | jsonl (default: from the suffix)")
    c.add_argument("--out-format", default=None, help="output format (default: from the suffix)")
    c.add_argument("--report", default=None, help="also write the run report as JSON to this path")
    c.add_argument("--quiet", action="store_true", help="no progress bars")

    s = sub.add_parser("search", help="search a store")
    s.add_argument("store")
    s.add_argument("query")
    s.add_argument("-k", type=int, default=10)
    s.add_argument("--agpr", action="store_true", help="anchor-guided propagation re-ranking")
    s.add_argument("--tenant", default=None)
    s.add_argument("--json", action="store_true")
    s.add_argument("--embedder", default="auto", help="auto | default | PATH: the model of the store's vectors")
    s.add_argument("--device", default=None)

    i = sub.add_parser("info", help="counts, tenants, dimension, time span")
    i.add_argument("store")
    i.add_argument("--json", action="store_true")

    d = sub.add_parser("demo", help="compress the bundled sample store and show what changed")
    d.add_argument("--ratio", type=float, default=0.5)
    d.add_argument("--out", default=None, help="also write the sample and its compressed form here")
    d.add_argument("--device", default=None)
    return ap


def _compress(a) -> int:
    from .api import compress_file
    from .config import CompressConfig, MergeConfig, PartitionConfig, TreeConfig
    from .report import format_report

    cfg = CompressConfig(
        partition=PartitionConfig(alpha=a.alpha, beta=a.beta, window=a.window, max_iter=a.max_iter, seed=a.seed),
        tree=TreeConfig(eta=a.eta, degree_norm=a.degree_norm),
        merge=MergeConfig(ratio=a.ratio, schedule=a.schedule, max_node_tokens=a.max_node_tokens, seed=a.seed),
    )
    res = compress_file(a.input, a.output, cfg, embedder=a.embedder, merger=a.merger, device=a.device,
                        progress=not a.quiet and sys.stderr.isatty(), format=a.format, out_format=a.out_format)
    print(format_report(res.report))
    print(f"wrote {a.output}")
    if a.report:
        from .io import atomic_write_text

        atomic_write_text(a.report, json.dumps(res.report.to_dict(), indent=2))
    return 0


def _search(a) -> int:
    from .api import load_store
    from .config import RetrievalConfig
    from .embedders import get_embedder
    from .io import read_store
    from .retrieval import Retriever
    from .timeutil import format_date

    cfg = RetrievalConfig(k=a.k, agpr=a.agpr)
    store = read_store(a.store, device=a.device) if a.embedder == "auto" else load_store(
        a.store, embedder=a.embedder, device=a.device)
    emb = get_embedder("default" if a.embedder == "auto" and store.embedder in (None, "all-MiniLM-L6-v2")
                       else ("auto" if a.embedder == "auto" else a.embedder),
                       device=a.device, store_embedder=store.embedder)
    if emb is None:
        raise ValueError(f"the query needs the model that made the store's vectors ({store.embedder!r}); "
                         "pass --embedder PATH")
    if emb.dim != store.dim:
        raise ValueError(f"embedder dimension must match the store's ({store.dim}), got {emb.dim}")
    hits = Retriever(store).search(emb.embed([a.query]), tenants=a.tenant, config=cfg).hits(store)[0]
    if a.json:
        print(json.dumps(hits, ensure_ascii=False, indent=2))
        return 0
    for r, h in enumerate(hits, 1):
        print(f"{r:>2}. [{format_date(h['timestamp'])}] ({h['score']:.3f}) {h['text']}")
    return 0


def _info(a) -> int:
    from .io import read_store

    info = read_store(a.store, embedder=_NoEmbed()).info()
    if a.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"nodes      {info['nodes']}  (standing for {info['originals']} originals; {info['merged_nodes']} merged)")
    print(f"tenants    {info['tenants']}")
    for t, n in info["nodes_per_tenant"].items():
        print(f"  {t:<24} {n}")
    print(f"dimension  {info['dim']}  (embedder: {info['embedder'] or 'unknown'})")
    print(f"time span  {info['time_first']} .. {info['time_last']}")
    return 0


class _NoEmbed:
    """`info` never embeds: a file without vectors is reported, not embedded."""

    name = None
    dim = 0

    def embed(self, texts):
        raise ValueError("this store has no embeddings; `memforest info` reads stored vectors only "
                         "(compress or search embed on load)")


def _demo(a) -> int:
    from .demo import run_demo

    run_demo(ratio=a.ratio, out_dir=a.out, device=a.device)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s: %(message)s")
    try:
        return {"compress": _compress, "search": _search, "info": _info, "demo": _demo}[args.cmd](args)
    except (ValueError, FileNotFoundError, ImportError) as e:
        print(f"memforest {args.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
