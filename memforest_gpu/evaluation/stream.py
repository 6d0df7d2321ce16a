"""``memforest eval --stream``: a benchmark replayed session by session, every tenant kept
within a budget after each session, questions asked at the end (docs/compaction.md).

For each budget (a fraction of each tenant's final uncompressed size):

- **stream** (MemForest): after every session, :func:`~memforest_gpu.engine.compaction.compact`
  (new memories placed into the trees, only the trees that need it re-planned);
- **full** (MemForest, a work reference): after every session, ``compress`` of the whole
  current store (old merged nodes included; every tenant partitioned and every tree built)
  to the same per-tenant targets: what keeping a store small costs without ``compact``;
- **rerun** (MemForest, a work reference, ``rerun=True``): after every session, ``compress``
  of every memory so far, uncompressed, to the sizes the stream has then: the offline
  one-shot at every step, whose work grows with the store;
- **stream** baselines: after every session, the baseline applied to each tenant over its
  budget, removing what compaction removes (the same counts);
- **offline** (the upper reference): one compression of the final uncompressed store to the
  sizes the stream ended at, per tenant.

Sessions: LoCoMo's ``metadata.session`` (a tenant's sessions in date order), else each UTC
day; step ``k`` brings every tenant's ``k``-th session. Scores, retention and the cluster
bootstrap are those of :mod:`.harness` / :mod:`.result_files`; the labels are ``stream-*``,
``full-*`` and ``offline-*`` and a budget of ``b`` is the block ``ratio 1 - b``.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..config import CompactConfig, CompressConfig
from ..device import resolve_device
from ..engine import compress
from ..engine.compaction import compact
from ..engine.partition import partition_nodes
from ..engine.quotas import Quotas, allocate_segments
from ..mergers.extractive import ExtractiveMerger
from ..store.column_checks import DEFAULT_TENANT
from ..store.memory_store import MemoryStore
from ..store.splice import append, splice
from .baselines import BASELINES
from .dataset import Benchmark
from .harness import EvalConfig, EvalResult, _Questions, _Records, _score_store
from .methods import MethodSpec, compress_with, parse_method

__all__ = ["StreamConfig", "run_stream", "session_steps"]


@dataclass(frozen=True, kw_only=True)
class StreamConfig:
    budgets: tuple = (0.7, 0.5, 0.3)  # each tenant's budget: this fraction of its final uncompressed size
    low_water: float = 0.8  # a tenant over budget is compacted to floor(low_water * budget)
    full_reference: bool = True  # also re-run compress on the whole current store after every session
    rerun: bool = False  # also compress all memories so far, uncompressed, after every session


def session_steps(bench: Benchmark) -> list[np.ndarray]:
    """Node indices arriving at each step: every tenant's k-th session (by date) at step k."""
    by: dict[tuple, list[int]] = {}
    first: dict[tuple, float] = {}
    for i, n in enumerate(bench.nodes):
        meta = n.get("metadata") or {}
        ts = float(n["timestamp"]) if not isinstance(n["timestamp"], str) else i
        key = (n.get("tenant", DEFAULT_TENANT), meta.get("session", int(ts // 86400)))
        by.setdefault(key, []).append(i)
        first[key] = min(first.get(key, ts), ts)
    per: dict[str, list[tuple]] = {}
    for key in sorted(by, key=lambda k: (k[0], first[k], str(k[1]))):
        per.setdefault(key[0], []).append(key)
    steps = max(len(v) for v in per.values())
    return [np.array(sorted(i for keys in per.values() if k < len(keys) for i in by[keys[k]]), dtype=np.int64)
            for k in range(steps)]


def _budgets(full: MemoryStore, frac: float, low_water: float) -> CompactConfig:
    n = np.bincount(full.tenant_codes_np, minlength=len(full.tenant_table))
    return CompactConfig(max_nodes={t: max(1, int(np.floor(frac * c))) for t, c in zip(full.tenant_table, n)},
                         low_water=low_water)


def _over(store: MemoryStore, limits: CompactConfig) -> dict[str, int]:
    """Tenant -> nodes to remove, for the tenants over budget."""
    n = np.bincount(store.tenant_codes_np, minlength=len(store.tenant_table))
    return {t: int(c) - limits.keep(t) for t, c in zip(store.tenant_table, n) if c > limits.max_nodes_of(t)}


def _full_compress(store: MemoryStore, limits: CompactConfig, cfg: CompressConfig, merger, embedder, device):
    """compress of the whole store: every tenant partitioned and every tree built; the tenants
    over budget lose what compaction would take."""
    need = _over(store, limits)
    if not need:
        return store, 0
    names, codes = store.tenant_index()
    part = partition_nodes(store.embeddings, store.timestamps, codes, names, cfg.partition)
    tt = part.tree_tenant.cpu().numpy()
    size = torch.bincount(part.tree, minlength=len(tt)).cpu().numpy().astype(np.int64)
    target = np.array([need.get(t, 0) for t in names], dtype=np.int64)
    per = allocate_segments(target, size, size - 1, tt, len(names))
    given = np.bincount(tt, weights=per, minlength=len(names)).astype(np.int64)
    q = Quotas(per, size, tt, target, target - given)
    res = compress(store, cfg, merger=merger, embedder=embedder, device=device, partition=part, quotas=q)
    return res.store, res.report.merges


def _per_tenant(store: MemoryStore, need: dict[str, int], fn):
    """``fn(tenant store, nodes to remove) -> compressed store`` on each tenant of ``need``; the
    others as they are."""
    if not need:
        return store, 0
    parts, merges = [], 0
    for t in store.tenant_table:
        sub = store.select_tenant(t)
        if t in need and need[t] > 0:
            res = fn(sub, need[t])
            sub, merges = res.store, merges + res.report.merges
        parts.append(sub)
    return splice(parts, [np.full(len(p), j) for j, p in enumerate(parts)]), merges


def _ratio_cfg(cfg: CompressConfig, remove: int, n: int) -> CompressConfig:
    return dataclasses.replace(cfg, merge=dataclasses.replace(cfg.merge, ratio=remove / n))


class _Timed:
    """The embedder of one replay: merged texts are embedded by the model itself (past the
    run's shared embedding cache) through a cache of the replay's own, so a replay is charged
    for every text it embeds and never gets another replay's (or an earlier run's) vectors
    for free. A text the replay embedded at an earlier session is reused, as the embedder of
    a long-lived process would (``SentenceTransformerEmbedder`` keeps such a cache).

    ``seconds``: time in ``embed``; ``texts``: texts asked for (what an embedder without any
    cache would embed); ``embedded``: texts the model embedded."""

    def __init__(self, embedder):
        self.shared = embedder
        self.model = getattr(embedder, "inner", embedder)  # past a CachedEmbedder
        self._vec: dict[str, torch.Tensor] = {}
        self.seconds, self.texts, self.embedded = 0.0, 0, 0

    def embed(self, texts):
        texts = list(texts)
        t0 = time.perf_counter()
        try:
            todo = list(dict.fromkeys(t for t in texts if t not in self._vec))
            if todo:
                out = self.model.embed(todo).detach().to("cpu", torch.float32)
                self._vec.update(zip(todo, out))
            self.texts, self.embedded = self.texts + len(texts), self.embedded + len(todo)
            if not texts:
                return torch.empty(0, int(self.shared.dim), dtype=torch.float32)
            return torch.stack([self._vec[t] for t in texts])
        finally:
            self.seconds += time.perf_counter() - t0

    def __getattr__(self, name):  # name, dim, max_tokens, count_tokens (memoised by the shared cache)
        return getattr(self.shared, name)


def _replay(full: MemoryStore, steps, limits: CompactConfig, kind: str, spec: MethodSpec, cfg, merger, embedder,
            device, sizes: list[dict] | None = None) -> tuple[MemoryStore, list[dict]]:
    """Replay the sessions with one policy; one work record per step (``sizes``: the stream's
    per-tenant sizes after each step, the targets of ``rerun``)."""
    store, work, seen = None, [], np.zeros(0, dtype=np.int64)
    emb = _Timed(embedder)
    for k, rows in enumerate(steps):
        new = full.take(rows)
        store = new if store is None else append(store, new)
        seen = np.sort(np.r_[seen, rows])
        t0, e0, x0, m0 = time.perf_counter(), emb.seconds, emb.texts, emb.embedded
        if kind == "stream" and spec.is_memforest:
            res = compact(store, limits, cfg, merger=merger, embedder=emb, device=device)
            store, merges = res.store, res.report.merges
        elif kind == "full":
            store, merges = _full_compress(store, limits, cfg, merger, emb, device)
        elif kind == "rerun":
            raw = full.take(seen)
            n = dict(zip(raw.tenant_table, np.bincount(raw.tenant_codes_np).tolist()))
            store, merges = _per_tenant(raw, {t: n[t] - sizes[k][t] for t in n}, lambda s, r: compress(
                s, _ratio_cfg(cfg, r, len(s)), merger=merger, embedder=emb, device=device))
        else:
            fn = BASELINES[spec.name]
            store, merges = _per_tenant(store, _over(store, limits), lambda s, r: fn(
                s, _ratio_cfg(cfg, r, len(s)), merger=merger, embedder=emb))
        wall = time.perf_counter() - t0
        work.append({"step": k, "arrived": int(len(rows)), "nodes": len(store), "merges": int(merges),
                     "seconds": wall, "embed_seconds": emb.seconds - e0,
                     "texts": emb.texts - x0, "embedded": emb.embedded - m0,
                     "sizes": dict(zip(store.tenant_table, np.bincount(store.tenant_codes_np).tolist()))})
    return store, work


def run_stream(bench: Benchmark, methods, scfg: StreamConfig, seeds=(0,), *, embedder, merger=None,
               base_config: CompressConfig | None = None, eval_config: EvalConfig | None = None, device=None,
               progress=None) -> tuple[EvalResult, list[dict]]:
    """The streaming replay of ``bench`` (see the module docstring). ``methods``: MemForest
    specs (streamed with compact, and with ``full`` compress) and baselines (streamed per
    tenant); ``progress(line)`` is called after each replay. Returns the scores as an
    :class:`EvalResult` (``stream-*``, ``full-*``, ``offline-*`` labels) and the work records."""

    dev = resolve_device(device)
    cfg_eval = eval_config or EvalConfig()
    base = base_config or CompressConfig()
    merger = merger if merger is not None else ExtractiveMerger()
    specs = [parse_method(m) if isinstance(m, str) else m for m in methods]
    flush = getattr(embedder, "flush", lambda: 0)
    full = bench.store(embedder, device=dev)
    q = _Questions(bench, embedder, dev)
    flush()
    _warm_up(embedder)  # the model loads before any replay is timed
    originals = dict(zip(full.ids, full.texts))
    out = _Records(bench.name, q)
    out.uncompressed(full, originals, cfg_eval)
    steps = session_steps(bench)
    work: list[dict] = []
    labels: list[str] = []
    for frac in scfg.budgets:
        ratio = round(1.0 - frac, 6)
        limits = _budgets(full, frac, scfg.low_water)
        sizes = None
        for spec in specs:
            for seed in seeds:
                cfg = spec.config(base, ratio=0.5, seed=seed)
                kinds = ["stream"] + (["full"] if spec.is_memforest and scfg.full_reference else []) \
                    + (["rerun"] if spec.is_memforest and scfg.rerun else [])
                trajectory = None
                for kind in kinds:
                    final, w = _replay(full, steps, limits, kind, spec, cfg, merger, embedder, dev,
                                       [r["sizes"] for r in trajectory] if trajectory else None)
                    flush()
                    lab = MethodSpec(f"{kind}-{spec.name}", spec.schedule)
                    _score(out, lab, ratio, seed, final, q, cfg_eval, originals)
                    labels.append(lab.label)
                    work += [{**r, "method": lab.label, "budget": frac, "seed": seed} for r in w]
                    if kind == "stream":
                        trajectory = w
                        sizes = dict(zip(final.tenant_table, np.bincount(final.tenant_codes_np).tolist()))
                    if progress:
                        progress(f"{lab.label} budget {frac:g} seed {seed}: {len(final)} nodes, "
                                 f"{sum(r['merges'] for r in w)} merges, {sum(r['seconds'] for r in w):.1f}s "
                                 f"({sum(r['embed_seconds'] for r in w):.1f}s embedding "
                                 f"{sum(r['embedded'] for r in w)} "
                                 f"of {sum(r['texts'] for r in w)} texts)")
                t0 = time.perf_counter()
                final = _offline(full, sizes, spec, cfg, merger, embedder, dev)
                lab = MethodSpec(f"offline-{spec.name}", spec.schedule)
                _score(out, lab, ratio, seed, final, q, cfg_eval, originals)
                labels.append(lab.label)
                work.append({"step": -1, "method": lab.label, "budget": frac, "seed": seed, "nodes": len(final),
                             "seconds": time.perf_counter() - t0})
    meta = {**bench.summary(), "merger": getattr(merger, "name", type(merger).__name__),
            "merger_kind": "non-LLM" if getattr(merger, "name", "") == "extractive" else "configured",
            "embedder": getattr(embedder, "name", type(embedder).__name__),
            "methods": list(dict.fromkeys(labels)), "ratios": [round(1 - b, 6) for b in scfg.budgets],
            "seeds": list(seeds), "steps": len(steps), "low_water": scfg.low_water, "stream": True,
            "eval": {"k": cfg_eval.k, "budget": cfg_eval.max_tokens, "L": cfg_eval.L, "lam": cfg_eval.lam,
                     "gamma": cfg_eval.gamma}, "device": str(dev)}
    return EvalResult(out.records, out.per_q, q.ids, q.categories, meta, list(q.tenants)), work


def _warm_up(embedder) -> None:
    inner = getattr(embedder, "inner", embedder)  # past an embedding cache
    inner.embed(["warm-up"])
    if callable(getattr(embedder, "count_tokens", None)):
        embedder.count_tokens(["warm-up"])


def _offline(full: MemoryStore, sizes: dict, spec: MethodSpec, cfg, merger, embedder, dev) -> MemoryStore:
    """One compression of the final uncompressed store to the stream's final sizes."""
    need = {t: len_t - sizes[t] for t, len_t in zip(full.tenant_table, np.bincount(full.tenant_codes_np).tolist())}
    store, _ = _per_tenant(full, need, lambda s, r: compress_with(spec, s, _ratio_cfg(cfg, r, len(s)), merger=merger,
                                                                  embedder=embedder, device=dev))
    return store


def _score(out: _Records, spec: MethodSpec, ratio, seed, store, q, cfg_eval, originals) -> None:
    _, scores, _ = _score_store(store, q, cfg_eval, originals)
    out.scores(spec, ratio, seed, scores)
    out.emit(spec.name, spec.schedule, ratio, seed, "-", "-", "nodes", "all", len(store))
