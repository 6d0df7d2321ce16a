"""``memforest demo``: compress the bundled sample store and show what changed (its flags:
:mod:`.demo_args`)."""
from __future__ import annotations

import os
import textwrap
from importlib import resources

from ..config import CompressConfig, MergeConfig, PartitionConfig, RetrievalConfig, SpanningConfig
from ..engine import compress
from ..mergers.embedders import SentenceTransformerEmbedder
from ..retrieval.context import dated_sentences
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
    return CompressConfig(partition=PartitionConfig(alpha=0.001),
                          spanning=SpanningConfig(time_weight=0.5, size_weight=0.2),
                          merge=MergeConfig(ratio=ratio, schedule="matching"))


def sample_path() -> str:
    """Path of the bundled sample store (three users, a year of sessions each; no embeddings)."""
    return str(resources.files("memforest_gpu") / "data" / "sample_memories.jsonl")


def _wrap(s: str, width: int = 96, indent: str = "    ") -> str:
    return textwrap.fill(s, width=width, initial_indent=indent, subsequent_indent=indent)


def _show_pairs(p, merges, store, out, users: int = 3) -> None:
    """Per user, the most similar pair of two of its memories merged: both memories and the
    text the merger wrote for them (a later round may merge that node again: said, not shown)."""
    p("A few merges, side by side (the most similar pair of memories merged in each user's store):")
    orig = {i: k for k, i in enumerate(store.ids)}
    home = {s: j for j, srcs in enumerate(out.sources) for s in srcs}
    shown = set()
    for rec in sorted(merges, key=lambda r: -r.similarity):
        if rec.tenant in shown or rec.a not in orig or rec.b not in orig:
            continue  # a pair of two memories, not a node that already merged others
        shown.add(rec.tenant)
        p(f"\n  [{rec.tenant}] similarity {rec.similarity:.2f}")
        for label, nid in (("older", rec.a), ("newer", rec.b)):
            k = orig[nid]
            p(_wrap(f"{label}: [{format_date(float(store.timestamps[k]))}] {store.texts[k]}"))
        p(_wrap(f"merged: {rec.text}"))
        n = len(out.sources[home[rec.a]])
        if n > 2:
            p(_wrap(f"(a later round merged this node again: it ends as one node of {n} memories)"))
        if len(shown) == users:
            break


def _matched_part(text: str, timestamp: float, q_vec, embedder) -> tuple[str, int]:
    """A merged node's dated segment (its sentences under one date tag) closest to the query,
    and how many segments the node has."""
    segs: dict[str, list[str]] = {}
    for tag, sent in dated_sentences(text, timestamp):
        segs.setdefault(tag, []).append(sent)
    parts = [f"{tag} {' '.join(sents)}" for tag, sents in segs.items()]
    if len(parts) == 1:
        return parts[0], 1
    best = int((embedder.embed(parts) @ q_vec.reshape(-1)).argmax())
    return parts[best], len(parts)


def _show_query(p, store, out, embedder) -> None:
    """The showcase query answered from both stores (top 3, AGPR). A merged hit is shown by its
    part that matched (its dated segment closest to the query), as ``memforest search --max-tokens``
    gives a merged node's matching part first: its other memories are whatever the compression
    merged into it, related to the query or not (the sample's tuned run merges "planning a trip
    to Lisbon" with "Sam's parents are visiting", similarity 0.42, into a node the query finds),
    so they are counted, not printed."""
    tenant, query = DEMO_QUERY
    cfg = RetrievalConfig(k=3, agpr=True)
    qe = embedder.embed([query])
    p(f"\nQuery for {tenant}: {query!r} (top 3, AGPR; a merged node shown by its part that matched)")
    for label, st in (("before", store), ("after", out)):
        hits = Retriever(st).search(qe, tenants=tenant, config=cfg).hits(st)[0]
        p(f"  {label}:")
        for r, h in enumerate(hits, 1):
            if len(h["sources"]) > 1:
                part, n = _matched_part(h["text"], h["timestamp"], qe, embedder)
                more = f" (1 of the {n} dated parts of a node of {len(h['sources'])} memories)" if n > 1 else ""
                p(_wrap(f"{r}. {part}{more}", indent="    "))
            else:
                date = "" if h["text"].startswith("[") else f"[{format_date(h['timestamp'])}] "
                p(_wrap(f"{r}. {date}{h['text']}", indent="    "))


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

    _show_pairs(p, res.merges, store, out)
    _show_query(p, store, out, embedder)
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
