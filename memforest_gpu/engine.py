"""Progressive merging (SPEC sections 2-3): the orchestration around the kernels.

One merge round, for every tree of every tenant at once:
  spanning tree (batched Borůvka) -> degree-adjusted scores -> pick pairs (one per tree,
  or a disjoint set) -> ONE merger call with all pairs -> ONE embedder call -> update.
Trees of similar size share a padded batch with a cached similarity matrix (B, m, m)
(:mod:`.tree_batch`); a merge rewrites one row/column of it instead of recomputing it.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from .config import CompressConfig
from .device import resolve_device
from .embedders import count_words
from .kernels import best_edge_per_tree, greedy_matching, spanning_forest, tree_degrees
from .kernels.mst import edge_key
from .mergers.base import MergePair
from .mergers.extractive import ExtractiveMerger
from .node_table import NodeTable, merged_id
from .partition import partition
from .quota import allocate, removal_target
from .store import MemoryStore
from .tree_batch import TreeBatch, apply_round, make_batches, mean_embeddings, pair_nodes

__all__ = ["compress", "CompressResult", "CompressReport", "merged_id"]

log = logging.getLogger("memforest_gpu")

DATE_TAG_TOKENS = 12  # upper bound on the word pieces the date tags of one merge add
SIZE_SCALE = 256  # tokens: the size term's unit when no node-token cap is set
_DAY = 86400.0


@dataclass
class CompressReport:
    """What a compression did. ``tenants`` has one dict per tenant."""

    tenants: list[dict]
    nodes_in: int
    nodes_out: int
    trees: int
    rounds: int
    merges: int
    schedule: str
    merger: str
    embedder: str
    max_node_tokens: int | None
    seconds: dict = field(default_factory=dict)
    fallbacks: int = 0
    moved_by_reassignment: int = 0
    kmeans_iterations: dict = field(default_factory=dict)

    @property
    def ratio_reached(self) -> float:
        return 1.0 - self.nodes_out / self.nodes_in if self.nodes_in else 0.0

    @property
    def shortfall(self) -> int:
        return sum(t["shortfall"] for t in self.tenants)

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["ratio_reached"] = self.ratio_reached
        d["shortfall"] = self.shortfall
        return d


@dataclass
class CompressResult:
    store: MemoryStore
    report: CompressReport
    merges: list[dict]  # one per merge: round, tenant, a, b, into, similarity


class _Nodes(NodeTable):
    """The run's node table plus the engine's per-node extras: token counts (when lengths
    are tracked) and the embeddings of merged nodes (row N + i is ``new_emb[i]``)."""

    def __init__(self, store: MemoryStore, tokens: list[int] | None):
        super().__init__(store)
        self.tokens = tokens
        self.new_emb: list[torch.Tensor] = []

    def add_merged(self, older: int, newer: int, text: str, emb: torch.Tensor, tokens: int | None) -> int:
        j = self.add(older, newer, text)
        if self.tokens is not None:
            self.tokens.append(int(tokens))
        self.new_emb.append(emb)
        return j


def compress(store: MemoryStore, config: CompressConfig | None = None, *, merger=None, embedder=None,
             device=None, progress: bool = False, on_round: Callable[[int, list[dict]], None] | None = None,
             plan_only: bool = False, budget: int = 1 << 24) -> CompressResult:
    """Compress ``store`` with MemForest.

    Args:
        config: stage configs (defaults: SPEC).
        merger: any :class:`~memforest_gpu.mergers.Merger`; default the extractive merger.
        embedder: re-embeds merged text (``None``: normalised mean of the two inputs).
        device: where the tensor work runs (``None``: CUDA when present).
        progress: show progress bars.
        on_round: called after each round with (round, merges of the round).
        plan_only: stop before the first merge: ``merges`` lists the first round's planned
            pairs (a, b, similarity, texts) and ``store`` is the input, unchanged (a dry run).

    Every tenant loses exactly ``round(ratio * N_t)`` nodes unless it cannot (report's
    ``shortfall``); every original id ends in exactly one output node's ``sources``.
    """
    cfg = config or CompressConfig()
    if not isinstance(cfg, CompressConfig):
        raise ValueError(f"config must be a CompressConfig, got {type(cfg).__name__}")
    if not isinstance(store, MemoryStore):
        raise ValueError(f"store must be a MemoryStore, got {type(store).__name__}")
    dev = resolve_device(device)
    merger = merger if merger is not None else ExtractiveMerger()
    fallback_merger = merger if isinstance(merger, ExtractiveMerger) else ExtractiveMerger()
    if embedder is not None and embedder.dim != store.dim:
        raise ValueError(
            f"embedder dimension must match the store's ({store.dim}), got {embedder.dim} from {embedder.name!r}; "
            "use the model that made the store's vectors, or no embedder (mean of the two vectors)")
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    emb = store.embeddings.to(dev)
    ts_all = store.timestamps.to(dev)
    names, codes = store.tenant_index()
    codes = codes.to(dev)
    N = len(store)

    # ---- 1. partition
    bar = _bar(progress, N, "partition")
    part = partition(emb, ts_all, codes, names, cfg.partition, budget=budget,
                     progress=(lambda n: bar.update(n)) if bar else None)
    if bar:
        bar.close()
    times["partition"] = time.perf_counter() - t0

    # ---- 2. quotas: exact per tenant, spread over trees by size
    t1 = time.perf_counter()
    n_trees = int(part.tree_tenant.shape[0])
    tree_size = torch.bincount(part.tree, minlength=n_trees).cpu().numpy().astype(np.int64)
    tree_tenant = part.tree_tenant.cpu().numpy()
    ten_size = np.bincount(codes.cpu().numpy(), minlength=len(names))
    target = np.array([removal_target(int(n), cfg.merge.ratio) for n in ten_size], dtype=np.int64)
    quota = np.zeros(n_trees, dtype=np.int64)
    shortfall = np.zeros(len(names), dtype=np.int64)
    trees_of = [np.flatnonzero(tree_tenant == t) for t in range(len(names))]
    for t, tr in enumerate(trees_of):
        quota[tr] = allocate(int(target[t]), tree_size[tr], tree_size[tr] - 1)
        shortfall[t] = target[t] - int(quota[tr].sum())
    count = tree_size.copy()  # live nodes per tree
    stuck = np.zeros(n_trees, dtype=bool)

    # ---- token budget per node
    cap = cfg.merge.max_node_tokens
    if cap is None and embedder is not None:
        cap = embedder.max_tokens
    tokens = None
    counter = getattr(embedder, "count_tokens", None) or count_words
    if cap is not None or cfg.tree.size_weight > 0:  # the size term needs lengths too
        tokens = counter(store.texts)

    nodes = _Nodes(store, tokens)
    buckets = make_batches(part.tree, tree_size, emb, store, tokens, dev)
    times["setup"] = time.perf_counter() - t1
    times["trees"] = times["merge"] = times["embed"] = 0.0

    # ---- 3. progressive merging, all trees and tenants per round
    total = int(quota.sum())
    bar = _bar(progress, total, "merging")
    merges_log: list[dict] = []
    rounds = 0
    fallbacks = 0
    rng = np.random.default_rng(cfg.merge.seed)
    while True:
        t2 = time.perf_counter()
        plan = []  # (bucket, row, slot_a, slot_b, similarity)
        for bk in buckets:
            rows = np.flatnonzero((quota[bk.trees_np] > 0) & ~stuck[bk.trees_np] & (count[bk.trees_np] >= 2))
            if len(rows) == 0:
                continue
            picks = _plan_bucket(bk, rows, quota, cfg, cap, rng)
            for r, pairs in picks:
                tree = int(bk.trees_np[r])
                if not pairs:
                    stuck[tree] = True
                for sa, sb, w in pairs:
                    plan.append((bk, r, sa, sb, w))
        times["trees"] += time.perf_counter() - t2
        # stuck trees hand their leftover to other trees of the same tenant
        _redistribute(stuck, quota, count, tree_tenant, trees_of, shortfall)
        if not plan:
            if ((quota > 0) & ~stuck & (count >= 2)).any():
                continue  # quota just moved to trees that sat this round out
            break
        ends = pair_nodes(plan)  # (a, b) node ids per pair, one device-to-host copy per bucket
        if plan_only:
            merges_log = []
            for (bk, r, sa, sb, w), (a, b) in zip(plan, ends):
                older, newer = nodes.order(a, b)
                merges_log.append({"round": 1, "tenant": nodes.tenant[older], "a": nodes.ids[older],
                                   "b": nodes.ids[newer], "similarity": float(w), "a_text": nodes.texts[older],
                                   "b_text": nodes.texts[newer]})
            break
        rounds += 1
        # one merger call for every pair of the round
        t3 = time.perf_counter()
        pairs_nodes = []
        batch = []
        for a, b in ends:
            older, newer = nodes.order(a, b)
            pairs_nodes.append((older, newer))
            batch.append(nodes.merge_pair(older, newer))
        texts, nfb = _run_merger(merger, fallback_merger, batch)
        fallbacks += nfb
        new_tok = None
        if tokens is not None:
            new_tok = counter(texts)
        if cap is not None:
            over = [j for j, c in enumerate(new_tok) if c > cap]
            if over and merger is not fallback_merger:
                fixed = fallback_merger.merge([batch[j] for j in over])
                for j, tx in zip(over, fixed):
                    texts[j] = tx
                fixed_tok = counter(fixed)
                for j, c in zip(over, fixed_tok):
                    new_tok[j] = c
                fallbacks += len(over)
        times["merge"] += time.perf_counter() - t3
        # one embedder call for every merged text
        t4 = time.perf_counter()
        if embedder is not None:
            new_emb = embedder.embed(texts).to(dev, torch.float32)
        else:
            new_emb = mean_embeddings(plan)
        times["embed"] += time.perf_counter() - t4
        t5 = time.perf_counter()
        round_log = []
        for j, ((bk, r, sa, sb, w), (older, newer)) in enumerate(zip(plan, pairs_nodes)):
            new = nodes.add_merged(older, newer, texts[j], new_emb[j], None if new_tok is None else new_tok[j])
            tree = int(bk.trees_np[r])
            quota[tree] -= 1
            count[tree] -= 1
            round_log.append({"round": rounds, "tenant": nodes.tenant[new], "a": nodes.ids[older],
                              "b": nodes.ids[newer], "into": nodes.ids[new], "similarity": float(w),
                              "a_index": older, "b_index": newer, "into_index": new})
        apply_round(plan, [rec["into_index"] for rec in round_log], new_emb, nodes)
        merges_log.extend(round_log)
        times["trees"] += time.perf_counter() - t5
        if on_round is not None:
            on_round(rounds, round_log)
        if bar:
            bar.update(len(plan))
    if bar:
        bar.close()

    if plan_only:
        times["total"] = time.perf_counter() - t0
        report = CompressReport(
            tenants=[], nodes_in=N, nodes_out=N, trees=n_trees, rounds=0, merges=0, schedule=cfg.merge.schedule,
            merger=getattr(merger, "name", type(merger).__name__),
            embedder=embedder.name if embedder is not None else "mean-of-inputs", max_node_tokens=cap,
            seconds=times, moved_by_reassignment=part.moved, kmeans_iterations=part.iterations)
        return CompressResult(store, report, merges_log)

    # ---- 4. output: live nodes, in order of their earliest original
    t6 = time.perf_counter()
    buckets = None  # the padded tree tensors (about 2x the embeddings) are not needed any more
    live = np.ones(len(nodes.ids), dtype=bool)
    for rec in merges_log:
        live[rec["a_index"]] = False
        live[rec["b_index"]] = False
    live_idx = nodes.output_order(np.flatnonzero(live))
    out = nodes.to_store(live_idx, _live_embeddings(emb, nodes.new_emb, live_idx))
    times["output"] = time.perf_counter() - t6
    times["total"] = time.perf_counter() - t0
    out_per = {t: 0 for t in names}
    for t in out.tenants:
        out_per[t] += 1
    ten_rows = []
    for t, name in enumerate(names):
        n_in = int(ten_size[t])
        ten_rows.append({"tenant": name, "nodes_in": n_in, "nodes_out": out_per[name],
                         "requested": int(target[t]), "removed": n_in - out_per[name],
                         "ratio": (n_in - out_per[name]) / n_in, "shortfall": int(shortfall[t]),
                         "trees": int(len(trees_of[t]))})
    report = CompressReport(
        tenants=ten_rows, nodes_in=N, nodes_out=len(out), trees=n_trees, rounds=rounds, merges=len(merges_log),
        schedule=cfg.merge.schedule, merger=getattr(merger, "name", type(merger).__name__),
        embedder=embedder.name if embedder is not None else "mean-of-inputs", max_node_tokens=cap,
        seconds=times, fallbacks=fallbacks, moved_by_reassignment=part.moved,
        kmeans_iterations=part.iterations,
    )
    return CompressResult(out, report, merges_log)


# --------------------------------------------------------------------------- helpers
def _bar(progress: bool, total: int, desc: str):
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="node" if desc == "partition" else "merge", leave=False)


def _plan_bucket(bk: TreeBatch, rows: np.ndarray, quota: np.ndarray, cfg: CompressConfig, cap, rng):
    """Pairs to merge this round for the given rows of a bucket: [(row, [(slot_a, slot_b, w), ...])]."""
    dev = bk.X.device
    r = torch.as_tensor(rows, dtype=torch.int64, device=dev)
    W = bk.W[r]  # (B', m, m)
    act = bk.active[r]  # (B', m)
    m = W.shape[1]
    kind = cfg.tree.kind
    if kind == "random":  # ablation: a random spanning tree, random merge order
        Rw = torch.from_numpy(rng.random((len(rows), m, m))).to(dev, W.dtype)
        Wt = torch.triu(Rw, 1) + torch.triu(Rw, 1).transpose(1, 2)
    else:
        Wt = W
        tw = cfg.tree.time_weight
        if tw > 0:  # local time on the edges: neighbouring spans of positions get the bonus
            lo, hi = bk.lo[r], bk.hi[r]  # (B', m)
            gap = torch.maximum(lo[:, :, None], lo[:, None, :]) - torch.minimum(hi[:, :, None], hi[:, None, :])
            Wt = (1 - tw) * W + tw * (gap <= cfg.tree.time_window).to(W.dtype)  # (B', m, m)
    est_all = None  # (B', m, m) estimated tokens of each pair's merged node, when lengths are tracked
    if bk.tok is not None and ((cfg.tree.size_weight > 0 and kind != "random") or cap is not None):
        tok_r, day_r = bk.tok[r], torch.floor(bk.ts[r] / _DAY)
        est_all = tok_r[:, :, None] + tok_r[:, None, :] + DATE_TAG_TOKENS * (day_r[:, :, None] != day_r[:, None, :]).long()
    if cfg.tree.size_weight > 0 and kind != "random" and est_all is not None:
        # size on the edges: the merged node's estimated length, in units of the cap
        scale = float(cap) if cap is not None else float(SIZE_SCALE)
        pen = cfg.tree.size_weight * est_all.to(W.dtype) / scale  # (B', m, m)
        Wt = Wt + pen if kind == "min" else Wt - pen
    if cap is not None and est_all is not None:
        # a pair whose merge would pass the cap is no edge: the tree spans the pairs that fit,
        # so a full node drops out of its tree instead of blocking it (SPEC: "the next best edge")
        Wt = Wt.masked_fill(est_all > cap, float("inf") if kind == "min" else float("-inf"))  # (B', m, m)
    u, v, w, ok = spanning_forest(Wt, act, maximum=(kind != "min"))
    deg = tree_degrees(u, v, ok, m)  # (B', m)
    dsum = (deg.gather(1, u) + deg.gather(1, v)).to(w.dtype)  # (B', E)
    if cfg.tree.degree_norm == "max":
        dmax = torch.where(ok, dsum, torch.zeros_like(dsum)).amax(1, keepdim=True).clamp(min=1)
        dsum = dsum / dmax
    eta = cfg.tree.eta
    score = eta * w - (1 - eta) * dsum  # (B', E)
    key = edge_key(u, v, m)
    eligible = ok
    if cap is not None and est_all is not None:
        eligible = ok & (est_all[torch.arange(len(rows), device=dev)[:, None], u, v] <= cap)  # (B', E)
    # the similarity reported for a pair is always the cosine, whatever tree was built
    real_w = W[torch.arange(len(rows), device=dev)[:, None], u, v] if Wt is not W else w
    out = []
    if cfg.merge.schedule == "sequential":
        best = best_edge_per_tree(score, key, eligible).cpu().numpy()
        uu, vv, ww = u.cpu().numpy(), v.cpu().numpy(), real_w.cpu().numpy()
        for j, row in enumerate(rows):
            e = best[j]
            out.append((int(row), [] if e < 0 else [(int(uu[j, e]), int(vv[j, e]), float(ww[j, e]))]))
    else:
        q = torch.as_tensor(quota[bk.trees_np[rows]], dtype=torch.int64, device=dev)
        matched = greedy_matching(u, v, score, key, eligible, m, cap=q).cpu().numpy()
        uu, vv, ww = u.cpu().numpy(), v.cpu().numpy(), real_w.cpu().numpy()
        for j, row in enumerate(rows):
            es = np.flatnonzero(matched[j])
            out.append((int(row), [(int(uu[j, e]), int(vv[j, e]), float(ww[j, e])) for e in es]))
    return out


def _live_embeddings(emb: torch.Tensor, new_emb: list[torch.Tensor], live_idx: np.ndarray) -> torch.Tensor:
    """Rows ``live_idx`` of originals followed by merged nodes, without concatenating all of
    them first. Shape: emb (N, D), new_emb [(D,)] * M, live_idx (L,) in [0, N + M) -> (L, D)"""
    N = emb.shape[0]
    idx = torch.as_tensor(live_idx, dtype=torch.int64, device=emb.device)
    out = torch.empty(len(live_idx), emb.shape[1], dtype=emb.dtype, device=emb.device)
    orig = idx < N
    out[orig] = emb[idx[orig]]
    if bool((~orig).any()):
        pos = torch.nonzero(~orig).flatten()
        out[pos] = torch.stack([new_emb[i - N] for i in live_idx[live_idx >= N].tolist()]).to(emb.dtype)
    return out


def _run_merger(merger, fallback, batch: list[MergePair]) -> tuple[list[str], int]:
    """Call the merger once; anything unusable falls back to the extractive merger."""
    n_fb = 0
    try:
        texts = list(merger.merge(batch))
        if len(texts) != len(batch):
            raise ValueError(f"merger must return one text per pair ({len(batch)}), got {len(texts)}")
    except Exception as e:  # noqa: BLE001 - an LLM backend failing must never lose memories
        if merger is fallback or getattr(merger, "fatal", False):
            raise  # the extractive merger itself, or a backend that is down as a whole: stop, don't guess
        log.warning("merger %r failed on a batch of %d pairs (%s); using the extractive merger",
                    getattr(merger, "name", merger), len(batch), e)
        return fallback.merge(batch), len(batch)
    bad = [j for j, t in enumerate(texts) if not isinstance(t, str) or not t.strip()]
    if bad:
        fixed = fallback.merge([batch[j] for j in bad])
        for j, t in zip(bad, fixed):
            texts[j] = t
        n_fb += len(bad)
    return texts, n_fb


def _redistribute(stuck, quota, count, tree_tenant, trees_of, shortfall):
    """Move the unmet quota of stuck trees to trees of the same tenant that can still merge."""
    left = stuck & (quota > 0)
    if not left.any():
        return
    for t in np.unique(tree_tenant[left]):
        tr = trees_of[t]
        give = int(quota[tr][stuck[tr]].sum())
        quota[tr[stuck[tr]]] = 0
        recv = tr[~stuck[tr]]
        room = np.maximum(count[recv] - 1 - quota[recv], 0)
        add = allocate(give, count[recv], room)
        quota[recv] += add
        shortfall[t] += give - int(add.sum())
