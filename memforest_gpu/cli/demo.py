"""``memforest demo``: compress the bundled sample store and show what changed (its flags:
:mod:`.demo_args`)."""
from __future__ import annotations

import os
import textwrap
from importlib import resources

from ..config import CompressConfig, MergeConfig, PartitionConfig, RetrievalConfig, TreeConfig
from ..engine import compress
from ..mergers.embedders import SentenceTransformerEmbedder
from ..retrieval.retriever import Retriever
from ..runs.paths import check_paths, writes
from ..store.io import read_store, write_store
from ..store.timeutil import format_date
from ..timer import StageTimer
from .demo_args import check
from .running import guarded

__all__ = ["run", "run_demo", "sample_path", "demo_config", "DEMO_QUERY"]

DEMO_QUERY = ("alice", "Where did Alice and Sam go on their autumn trip, and when?")


def demo_config(ratio: float = 0.5) -> CompressConfig:
    """The demo's compression: the tuned setting of the README's Evaluation (matching schedule,
    alpha 0.001, time weight 0.5, size weight 0.2), not the paper's defaults.

    With the paper's sequential schedule and no size term, one node of Alice's store grows by
    absorbing one memory after another: 8 memories of two events (the autumn trip and the
    move into a new flat, all worded "Alice and Sam ..."). Its re-embedded text is about both
    events, so its vector is diluted (cosine 0.56 to the showcase query, against 0.69 for the
    best memory alone and 0.78 for the mean of its 8 memories' vectors) and an unrelated
    memory ("Christmas in Lyon", 0.60) ranks first, with or without AGPR. The size term and
    the matching schedule keep merged nodes small (2-3 memories of one event), so the trip's
    node ranks first.
    """
    return CompressConfig(partition=PartitionConfig(alpha=0.001), tree=TreeConfig(time_weight=0.5, size_weight=0.2),
                          merge=MergeConfig(ratio=ratio, schedule="matching"))


def sample_path() -> str:
    """Path of the bundled sample store (three users, a year of sessions each; no embeddings)."""
    return str(resources.files("memforest_gpu") / "data" / "sample_memories.jsonl")


def _wrap(s: str, width: int = 96, indent: str = "    ") -> str:
    return textwrap.fill(s, width=width, initial_indent=indent, subsequent_indent=indent)


def run_demo(*, ratio: float = 0.5, out_dir: str | None = None, device=None, print_fn=print) -> dict:
    """Embed the sample, compress it at ``ratio``, print before/after statistics, a few
    merges side by side and one query answered from both stores. Returns the numbers."""
    config = demo_config(ratio)  # a bad ratio fails before the model loads
    timer = StageTimer()
    with timer.stage("embed"):
        embedder = SentenceTransformerEmbedder(device=device)
        store = read_store(sample_path(), embedder=embedder, device=device)
    res = compress(store, config, embedder=embedder, device=device)
    out, rep = res.store, res.report
    p = print_fn
    p(f"MemForest demo: {len(store)} sample memories of {len(store.tenant_names())} users, "
      f"compressed at ratio {ratio} (extractive merger, {embedder.name}, {store.device.type}; the tuned "
      "setting: matching schedule, alpha 0.001, time weight 0.5, size weight 0.2)\n")
    p(f"{'user':<8} {'before':>7} {'after':>6} {'words/node before':>18} {'after':>6} {'max tokens after':>17}")
    tok_after = embedder.count_tokens(out.texts)
    for name in store.tenant_names():
        b = [t for t, tt in zip(store.texts, store.tenants) if tt == name]
        a = [(t, k) for t, tt, k in zip(out.texts, out.tenants, tok_after) if tt == name]
        p(f"{name:<8} {len(b):>7} {len(a):>6} {sum(len(t.split()) for t in b) / len(b):>18.1f} "
          f"{sum(len(t.split()) for t, _ in a) / len(a):>6.1f} {max(k for _, k in a):>17}")
    p(f"\nremoved {rep.nodes_in - rep.nodes_out} of {rep.nodes_in} nodes (ratio {rep.ratio_reached:.3f}) in "
      f"{rep.rounds} rounds over {rep.trees} event trees; embedding {timer.seconds['embed']:.1f}s, compression "
      f"{rep.seconds['total']:.1f}s; every original id is kept in some node's `sources`.\n")

    p("A few merges, side by side (the most similar pair merged in each user's store):")
    by_id = {i: j for j, i in enumerate(out.ids)}
    shown = set()
    for rec in sorted(res.merges, key=lambda r: -r.similarity):
        if rec.tenant in shown or rec.into not in by_id:
            continue
        shown.add(rec.tenant)
        j = by_id[rec.into]
        p(f"\n  [{rec.tenant}] similarity {rec.similarity:.2f}")
        for label, nid in (("older", rec.a), ("newer", rec.b)):
            if nid in store.ids:
                k = store.ids.index(nid)
                p(_wrap(f"{label}: [{format_date(float(store.timestamps[k]))}] {store.texts[k]}"))
        p(_wrap(f"final node ({len(out.sources[j])} memories): {out.texts[j]}"))
        if len(shown) == 3:
            break

    tenant, query = DEMO_QUERY
    cfg = RetrievalConfig(k=3, agpr=True)
    qe = embedder.embed([query])
    p(f"\nQuery for {tenant}: {query!r} (top 3, AGPR)")
    for label, st in (("before", store), ("after", out)):
        hits = Retriever(st).search(qe, tenants=tenant, config=cfg).hits(st)[0]
        p(f"  {label}:")
        for r, h in enumerate(hits, 1):
            date = "" if h["text"].startswith("[") else f"[{format_date(h['timestamp'])}] "
            p(_wrap(f"{r}. {date}{h['text']}", indent="    "))
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        write_store(store, os.path.join(out_dir, "sample.parquet"))
        write_store(out, os.path.join(out_dir, "sample.compressed.parquet"))
        p(f"\nwrote {out_dir}/sample.parquet and {out_dir}/sample.compressed.parquet")
    return {"nodes_in": rep.nodes_in, "nodes_out": rep.nodes_out, "ratio_reached": rep.ratio_reached,
            "rounds": rep.rounds}


@guarded
def run(a) -> int:
    """``memforest demo``: the paths first, then the sample embedded, compressed and shown."""
    check(a)
    check_paths(writes("--out", a.out, folder=True))  # before the sample is embedded and compressed
    run_demo(ratio=a.ratio, out_dir=a.out, device=a.device)
    return 0
