"""The evaluation grid: methods x ratios x seeds, each scored with plain top-k and AGPR.

Per cell: compress the uncompressed store, build one
:class:`~memforest_gpu.retrieval.retriever.Retriever`
for the result, rank every question's candidates in one batched search per retriever,
score them (:mod:`.metrics`), and time the search against the uncompressed store in the
same loop. Questions are embedded once; merged text goes through the caller's embedder
(wrap it in :class:`~.cache.CachedEmbedder` so a re-run never re-embeds).

A cell whose output cannot depend on the seed (ToMe; MemForest when every tenant is a
single k-means cluster) is compressed and scored once and recorded for every seed.

Ranking for the cuts: a ranked list of ``C = L * k`` candidates. Plain: the top ``C`` by
cosine (its first ``k`` are the top-k). AGPR: the ``C`` candidates of a top-``k`` AGPR
search (anchors ``max(1, floor(lam*k + 0.5))``) ordered by AGPR's score ``v``; its first
``k`` are exactly what ``Retriever.search`` returns with ``k``. ``@B`` reads as far down
that list as its budget needs.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm.auto import tqdm

from ..config import CompressConfig, ConfigError, RetrievalConfig, config_record
from ..device import resolve_device
from ..engine.partition import n_clusters
from ..kernels.agpr import n_anchors
from ..mergers.extractive import ExtractiveMerger
from ..retrieval.context import FILLS
from ..retrieval.retriever import Retriever
from ..store.memory_store import MemoryStore
from ..store.size import store_size
from .context_fill import contexts, score_contexts
from .dataset import Benchmark
from .key_parts import key_split
from .lost_answers import classify, lost_table
from .methods import MethodSpec, compress_with, parse_method
from .metrics import CUTS, NodeViews, answer_tokens, nanmean, option_tokens, score_ranked

__all__ = ["EvalConfig", "EvalResult", "run_grid", "RETRIEVERS", "ranked_candidates", "MAX_K", "MAX_DEPTH"]

RETRIEVERS = ("plain", "agpr")
MAX_K = 1000  # nodes at the @k cut, at most (a context of more is no longer a retrieval)
MAX_DEPTH = 10_000  # L x k, the ranked list read per question, at most (its (Q, L x k) tensors)
RETAINED = ("ansr", "ansr_content", "evr", "j", "f1", "bleu1")  # metrics that get a retention record


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """How retrieved context is cut and scored (docs/evaluation.md defaults)."""

    k: int = 10  # nodes at the @k cut; also the retriever's k
    max_tokens: int = 256  # whitespace tokens at the @B cut
    L: int = 4  # AGPR candidate multiplier (also the depth of the ranked list: L * k)
    lam: float = 0.2  # AGPR anchors: max(1, floor(lam * k + 0.5))
    gamma: float = 0.9  # AGPR: v = gamma * s + (1 - gamma) * p
    search_repeats: int = 5  # timed searches per store and retriever (median taken)
    fill: str = "plain"  # @B context: plain (whole nodes, docs/evaluation.md) | ranked | focused (retrieval/context.py)

    def __post_init__(self):
        RetrievalConfig(k=self.k, L=self.L, lam=self.lam, gamma=self.gamma)  # validates
        if self.k > MAX_K:
            raise ConfigError("k", f"must be an integer in [1, {MAX_K}] (nodes at the @k cut), got {self.k!r}")
        if self.L * self.k > MAX_DEPTH:
            raise ConfigError("L", f"must be at most {MAX_DEPTH // self.k} with k = {self.k} (the ranked list holds "
                                   f"L x k nodes per question, at most {MAX_DEPTH}), got {self.L!r}")
        if self.fill not in FILLS:
            raise ValueError(f"fill must be one of {list(FILLS)}, got {self.fill!r}")
        if self.max_tokens < 1:
            raise ConfigError("max_tokens", f"must be an integer >= 1, got {self.max_tokens!r}")
        if self.search_repeats < 1:
            raise ConfigError("search_repeats", f"must be an integer >= 1, got {self.search_repeats!r}")

    def retrieval(self, retriever: str) -> RetrievalConfig:
        """The top-k config a user would run (used for the timed searches)."""
        return RetrievalConfig(k=self.k, agpr=retriever == "agpr", L=self.L, lam=self.lam, gamma=self.gamma)

    def ranking(self, retriever: str) -> RetrievalConfig:
        """A config whose output is the whole ranked candidate list (see module doc)."""
        C = self.L * self.k
        if retriever == "plain":
            return RetrievalConfig(k=C)
        return RetrievalConfig(k=C, agpr=True, L=1, lam=n_anchors(self.k, self.lam) / C, gamma=self.gamma)


@dataclass
class EvalResult:
    """``records``: flat dicts; ``per_question``: {cell key: (Q,) float32}; ``meta``: run facts;
    ``question_tenants``: each question's tenant (conversation), the clusters of the bootstrap."""

    records: list[dict]
    per_question: dict[str, np.ndarray]
    question_ids: list[str]
    categories: list[str]
    meta: dict = field(default_factory=dict)
    question_tenants: list[str] | None = None


def cell_key(method: str, ratio: float, seed: int, retriever: str, cut: str, metric: str) -> str:
    return f"{method}|{ratio:g}|{seed}|{retriever}|{cut}|{metric}"


def ranked_candidates(retriever: Retriever, queries: torch.Tensor, tenants: list[str], cfg: EvalConfig,
                      kind: str) -> np.ndarray:
    """Shape: queries (Q, D) -> (Q, L*k) store rows, best first (-1 = none)."""
    return retriever.search(queries, tenants=tenants, config=cfg.ranking(kind)).index.cpu().numpy()


class _Questions:
    """Questions, tokenised once. "all" leaves out abstention questions (reported apart in their
    own categories); a multiple-choice question's answer tokens are its option's distinctive
    ones."""

    def __init__(self, bench: Benchmark, embedder, device):
        qs = bench.questions
        self.questions = list(qs)
        self.ids = [q.id for q in qs]
        self.tenants = [q.tenant for q in qs]
        self.categories = [q.category for q in qs]
        self.answers = [option_tokens(q.answer, q.options) if q.options else answer_tokens(q.answer) for q in qs]
        self.evidence = [frozenset(q.evidence) for q in qs]
        self.emb = embedder.embed([q.question for q in qs]).to(device, torch.float32)  # (Q, D)
        self.cats = sorted(set(self.categories), key=lambda c: (len(c), c))
        self.cat_mask = {c: np.array([x == c for x in self.categories]) for c in self.cats}
        self.apart = sorted({q.category for q in qs if q.abstention})
        self.cat_mask["all"] = np.array([not q.abstention for q in qs], dtype=bool)


def _time_search(a: Retriever, b: Retriever, q: _Questions, rcfg: RetrievalConfig, repeats: int):
    """Median seconds of the same batched search on two stores, interleaved."""
    ta, tb = [], []
    for _ in range(repeats):
        for r, acc in ((a, ta), (b, tb)):
            t0 = time.perf_counter()
            res = r.search(q.emb, tenants=q.tenants, config=rcfg)
            if res.index.is_cuda:
                torch.cuda.synchronize()
            acc.append(time.perf_counter() - t0)
    return statistics.median(ta), statistics.median(tb)


def _score_store(store: MemoryStore, q: _Questions, cfg: EvalConfig, originals: dict[str, str], qa=None,
                 embedder=None):
    """Every metric of one store, per retriever; with ``qa`` (a :class:`~.qa.QAProtocol`) also the
    LLM protocol's, on the top-k of each retriever (both retrievers' questions in one batch).
    ``cfg.fill`` other than ``"plain"``: ``@B`` is the product's context over the same ranked list
    (:mod:`memforest_gpu.retrieval.context`: the parts of merged nodes cut by ``embedder``)."""
    retr = Retriever(store)
    views = NodeViews.build(store, originals)
    out = {}
    qa_ctx = []
    shown = None  # the plain retriever's @B contexts: where lost answers went (lost_answers.classify)
    for kind in RETRIEVERS:
        ranked = ranked_candidates(retr, q.emb, q.tenants, cfg, kind)
        for (cut, metric), v in score_ranked(ranked, views, q.answers, q.evidence, k=cfg.k,
                                             max_tokens=cfg.max_tokens).items():
            out[kind, cut, metric] = v
        if cfg.fill != "plain":
            if embedder is None:
                raise ValueError(f"fill={cfg.fill!r} needs the embedder of the store's vectors (it cuts merged nodes)")
            ctx = contexts(ranked, store, views, cfg.max_tokens, fill=cfg.fill, q_emb=q.emb, original_text=originals,
                           split=key_split(embedder.embed))
            out.update({(kind, "B", m): v for m, v in score_contexts(ctx, q.answers, q.evidence).items()})
        elif kind == "plain":
            ctx = contexts(ranked, store, views, cfg.max_tokens)
        if kind == "plain":
            shown = ctx
        qa_ctx += [[views.rendered[j] for j in row[:cfg.k] if j >= 0] for row in ranked.tolist()]
    if qa is not None:
        Q = len(q.ids)
        for metric, v in qa.score(q.questions * len(RETRIEVERS), qa_ctx).items():
            for r, kind in enumerate(RETRIEVERS):
                out[kind, "k", metric] = v[r * Q:(r + 1) * Q]
    return retr, out, shown


def run_grid(bench: Benchmark, methods, ratios, seeds, *, embedder, merger=None,
             base_config: CompressConfig | None = None, eval_config: EvalConfig | None = None, device=None,
             progress: bool = False, on_cell=None, qa=None) -> EvalResult:
    """Score every (method, ratio, seed) cell of the grid plus the uncompressed store.

    ``embedder`` embeds the originals, the questions and merged text (wrap it in a
    :class:`~.cache.CachedEmbedder`; its ``flush`` is called after every cell).
    ``on_cell(label, result)`` is called after each cell (for logs). ``qa``: a
    :class:`~.qa.QAProtocol` to also score the LLM protocol (answers from each cell's top-k,
    judged; metrics :data:`~.qa.QA_METRICS` at cut ``k``).
    """

    dev = resolve_device(device)
    cfg = eval_config or EvalConfig()
    base = base_config or CompressConfig()
    merger = merger if merger is not None else ExtractiveMerger()
    specs = [parse_method(m) if isinstance(m, str) else m for m in methods]
    specs = [s for s in specs if s.name != "none"]
    flush = getattr(embedder, "flush", lambda: 0)
    t_start = time.perf_counter()

    t0 = time.perf_counter()
    store = bench.store(embedder, device=dev)
    q = _Questions(bench, embedder, dev)
    flush()
    t_embed = time.perf_counter() - t0
    originals = dict(zip(store.ids, store.texts))
    out = _Records(bench.name, q, base.merge.vectors)
    base_retr = out.uncompressed(store, originals, cfg, qa, embedder)

    cells = [(s, r, sd) for r in ratios for s in specs for sd in seeds]
    bar = None
    if progress:
        bar = tqdm(total=len(cells), desc="eval grid", unit="cell")
    timings = []
    done: dict[tuple, tuple] = {}  # seed-free cells: (label, ratio, config) -> (result, seconds)
    tenant_sizes = list(Counter(store.tenants).values())
    for spec, ratio, seed in cells:
        if bar is not None:
            bar.set_postfix_str(f"{spec.label} @{ratio:g} seed {seed}")
        c = spec.config(base, ratio=ratio, seed=seed)
        key = (spec.label, ratio, _without_seeds(c)) if _seed_free(spec, c, tenant_sizes) else None
        t1 = time.perf_counter()
        if key is not None and key in done:
            res, t_comp, retr, scores, shown = done[key]  # the same output whatever the seed: scored once
        else:
            t0 = time.perf_counter()
            res = compress_with(spec, store, c, merger=merger, embedder=embedder, device=dev)
            t_comp = time.perf_counter() - t0
            flush()
            t1 = time.perf_counter()
            retr, scores, shown = _score_store(res.store, q, cfg, originals, qa, embedder)
            if key is not None:
                done[key] = (res, t_comp, retr, scores, shown)
        out.cell(spec, ratio, seed, scores, res, t_comp, base_retr, retr, cfg)
        out.lost(spec, ratio, seed, res.store, shown, originals)
        timings.append({"method": spec.label, "ratio": ratio, "seed": seed, "compress_s": t_comp,
                        "score_s": time.perf_counter() - t1})
        if on_cell is not None:
            on_cell(spec.label, ratio, seed, res)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    meta = {
        **bench.summary(),
        "merger": getattr(merger, "name", type(merger).__name__),
        "merger_kind": "non-LLM" if getattr(merger, "name", "") == "extractive" else "configured",
        "embedder": getattr(embedder, "name", type(embedder).__name__),
        "methods": [s.label for s in specs], "ratios": list(ratios), "seeds": list(seeds),
        **_run_facts(cfg, base, dev, q, qa, embedder),
        "seconds": {"embed_originals_and_questions": t_embed, "total": time.perf_counter() - t_start},
        "cells": timings,
    }
    return EvalResult(out.records, out.per_q, q.ids, q.categories, meta, list(q.tenants))


def _run_facts(cfg: EvalConfig, base: CompressConfig, dev, q: _Questions, qa, embedder) -> dict:
    """The run's settings for ``meta``: cuts, configs, device, question kinds, the LLM protocol."""
    return {"eval": {"k": cfg.k, "budget": cfg.max_tokens, "L": cfg.L, "lam": cfg.lam, "gamma": cfg.gamma,
                     "fill": cfg.fill},
            "config": config_record(base), "device": str(dev),
            "cache": {"hits": getattr(embedder, "hits", None), "misses": getattr(embedder, "misses", None)},
            "categories_apart": q.apart, "multiple_choice": sum(bool(x.options) for x in q.questions),
            **({"qa": qa.summary()} if qa is not None else {})}


class _Records:
    """The grid's results as they come: one record per (cell, retriever, cut, metric, category),
    the per-question scores of each cell, and the uncompressed store's means (the
    denominators of every retention) and size (of every size's share)."""

    def __init__(self, name: str, q: _Questions, encoding: str = "float32"):
        self.name, self.q = name, q
        self.encoding = encoding  # the outputs' vectors: every size is taken in it (store/size.py)
        self.records: list[dict] = []
        self.per_q: dict[str, np.ndarray] = {}
        self.denom: dict = {}

    def emit(self, method, schedule, ratio, seed, retriever, cut, metric, category, value) -> None:
        self.records.append({"benchmark": self.name, "method": method, "schedule": schedule, "ratio": ratio,
                             "seed": seed, "retriever": retriever, "cut": cut, "metric": metric,
                             "category": category,
                             "value": None if value is None or (isinstance(value, float) and math.isnan(value))
                             else float(value)})

    def scores(self, spec: MethodSpec, ratio, seed, scores) -> None:
        """Per-question scores, and their mean (and retention) per category."""
        for (kind, cut, metric), v in scores.items():
            self.per_q[cell_key(spec.label, ratio, seed, kind, cut, metric)] = v.astype(np.float32)
            for cat, mask in self.q.cat_mask.items():
                m = nanmean(v[mask])
                self.emit(spec.name, spec.schedule, ratio, seed, kind, cut, metric, cat, m)
                if metric in RETAINED:
                    d = self.denom[cut, metric, cat]
                    self.emit(spec.name, spec.schedule, ratio, seed, kind, cut, f"{metric}_retention", cat,
                              m / d if d else None)

    def uncompressed(self, store: MemoryStore, originals: dict, cfg: EvalConfig, qa=None, embedder=None) -> Retriever:
        """Score the uncompressed store (the denominators of every retention); returns its
        retriever."""
        base_retr, base_scores, self.base_shown = _score_store(store, self.q, cfg, originals, qa, embedder)
        self.base_ansr = base_scores["plain", "B", "ansr"]
        self.denom = {(cut, metric, cat): nanmean(base_scores["plain", cut, metric][mask])
                      for cut in CUTS for metric in RETAINED for cat, mask in self.q.cat_mask.items()
                      if ("plain", cut, metric) in base_scores}
        self.scores(MethodSpec("none"), 0.0, 0, base_scores)
        for kind in RETRIEVERS:
            ta, _ = _time_search(base_retr, base_retr, self.q, cfg.retrieval(kind), cfg.search_repeats)
            self.emit("none", "-", 0.0, 0, kind, "-", "search_ms", "all", 1e3 * ta)
        self.emit("none", "-", 0.0, 0, "-", "-", "nodes", "all", len(store))
        self.size_in = store_size(store, self.encoding)
        self._size("none", "-", 0.0, 0, self.size_in)
        return base_retr

    def _size(self, method, schedule, ratio, seed, size) -> None:
        """Vector rows and bytes, and their share of the uncompressed store's (same encoding)."""
        whole = {"rows": self.size_in.rows, "bytes": self.size_in.bytes}
        for metric, value in (("rows", size.rows), ("bytes", size.bytes)):
            self.emit(method, schedule, ratio, seed, "-", "-", metric, "all", value)
            self.emit(method, schedule, ratio, seed, "-", "-", f"{metric}_share", "all",
                      value / whole[metric] if whole[metric] else None)

    def lost(self, spec: MethodSpec, ratio, seed, store: MemoryStore, shown, originals: dict) -> None:
        """The AnsR@B points and answers (plain top-k) lost to condensing: answer tokens of an
        evidence memory that the merged node holding it no longer has (lost_answers.classify)."""
        cause, lost = classify(self.base_shown, shown, store, self.q.answers, self.q.evidence, originals)
        t = lost_table(cause, lost, self.base_ansr, self.q.cat_mask["all"])["condensed"]
        self.emit(spec.name, spec.schedule, ratio, seed, "plain", "B", "condensed_points", "all", t["points"] / 100)
        self.emit(spec.name, spec.schedule, ratio, seed, "plain", "B", "condensed_answers", "all", t["answers"])

    def cell(self, spec: MethodSpec, ratio, seed, scores, res, t_comp: float, base_retr, retr,
             cfg: EvalConfig) -> None:
        """One cell: its scores, search times against the uncompressed store's, and the run's
        figures."""
        self.scores(spec, ratio, seed, scores)
        for kind in RETRIEVERS:
            ta, tb = _time_search(base_retr, retr, self.q, cfg.retrieval(kind), cfg.search_repeats)
            self.emit(spec.name, spec.schedule, ratio, seed, kind, "-", "search_ms", "all", 1e3 * tb)
            self.emit(spec.name, spec.schedule, ratio, seed, kind, "-", "search_speedup", "all", ta / tb)
        rep = res.report
        self.emit(spec.name, spec.schedule, ratio, seed, "-", "-", "nodes", "all", len(res.store))
        self.emit(spec.name, spec.schedule, ratio, seed, "-", "-", "ratio_reached", "all", rep.ratio_reached)
        self.emit(spec.name, spec.schedule, ratio, seed, "-", "-", "shortfall", "all", rep.shortfall)
        self.emit(spec.name, spec.schedule, ratio, seed, "-", "-", "compress_s", "all", t_comp)
        self._size(spec.name, spec.schedule, ratio, seed, store_size(res.store, self.encoding))


def _seed_free(spec: MethodSpec, cfg: CompressConfig, tenant_sizes: list[int]) -> bool:
    """True when the method's output cannot depend on the seed: ToMe (no randomness), and
    MemForest when every tenant is one k-means cluster and the spanning kind is not random."""
    if spec.name == "tome":
        return True
    if spec.is_memforest:
        return cfg.spanning.kind != "random" and all(n_clusters(n, cfg.partition.alpha) == 1 for n in tenant_sizes)
    return False


def _without_seeds(c: CompressConfig) -> CompressConfig:
    return dataclasses.replace(c, partition=dataclasses.replace(c.partition, seed=0),
                               merge=dataclasses.replace(c.merge, seed=0))


