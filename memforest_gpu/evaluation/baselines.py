"""The five baselines of docs/method.md ("Baselines"), under the engine's rules.

Every baseline works per tenant (nothing crosses a tenant), removes exactly
``round(ratio * N_t)`` nodes of each tenant, and returns the engine's
:class:`~memforest_gpu.engine.CompressResult`. The merging ones use the same merger as
MemForest, the same node-length cap (``max_node_tokens``, default the embedder's window)
and re-embed merged text with the same embedder, so a comparison with MemForest is
about *which* pairs get merged.

- ``random_prune``: drop ``round(ratio*N)`` random nodes.
- ``kmeans_prune``: k-means into the kept count of clusters, keep the node nearest each
  centroid (a cluster left empty is made up by a random unkept node).
- ``dart``: ``max(1, round(0.02 N))`` random pivots; keep the pivots and the nodes least
  similar to them (largest cosine to any pivot, ascending; ties to the lower index).
- ``random_merge``: a random "drop" set of ``round(ratio*N)`` nodes, each merged into a
  random node of the "keep" set (one that still has room under the cap, when any has).
- ``tome``: alternate nodes (in time order) into A and B; each A node's most similar B
  node; merge the best ``min(left, |A|)`` such pairs (an A node whose merge would pass
  the cap is skipped); re-embed; repeat until the ratio is reached.

Random draws come from ``numpy.random.default_rng([seed, crc32(tenant)])``, so a tenant's
result never depends on the other tenants.
"""
from __future__ import annotations

import time
import zlib

import numpy as np
import torch

from ..config import CompressConfig
from ..engine import CompressReport, CompressResult
from ..engine.edges import DATE_TAG_TOKENS, merged_length, utc_day
from ..engine.merge_call import cap_and_counter, merge_texts, with_fallback
from ..engine.node_table import NodeTable
from ..engine.quotas import removal_target
from ..kernels.lloyd import cluster_centres, kmeans
from ..mergers.embedders import MEAN_EMBEDDER
from ..store.memory_store import MemoryStore

__all__ = ["random_prune", "kmeans_prune", "dart", "random_merge", "tome", "BASELINES", "DART_PIVOTS"]

DART_PIVOTS = 0.02


def _rng(seed: int, tenant: str) -> np.random.Generator:
    return np.random.default_rng([int(seed), zlib.crc32(tenant.encode("utf-8"))])


def _tenant_rows(store: MemoryStore) -> dict[str, np.ndarray]:
    """Rows of each tenant in time order (timestamp, then row)."""
    ts = store.timestamps.detach().cpu().numpy()
    out: dict[str, list[int]] = {}
    for i, t in enumerate(store.tenants):
        out.setdefault(t, []).append(i)
    return {t: np.array(sorted(r, key=lambda i: (ts[i], i)), dtype=np.int64) for t, r in out.items()}


def _report(store: MemoryStore, out: MemoryStore, name: str, t0: float, *, merges: int = 0, rounds: int = 0,
            merger=None, embedder=None, cap=None, shortfall: dict | None = None) -> CompressReport:
    shortfall = shortfall or {}
    n_in: dict[str, int] = {}
    n_out: dict[str, int] = {}
    for t in store.tenants:
        n_in[t] = n_in.get(t, 0) + 1
    for t in out.tenants:
        n_out[t] = n_out.get(t, 0) + 1
    rows = []
    for t, n in n_in.items():
        o = n_out.get(t, 0)
        rows.append({"tenant": t, "nodes_in": n, "nodes_out": o, "requested": n - o + shortfall.get(t, 0),
                     "removed": n - o, "ratio": (n - o) / n, "shortfall": shortfall.get(t, 0), "trees": 0})
    return CompressReport(
        tenants=rows, nodes_in=len(store), nodes_out=len(out), trees=0, rounds=rounds, merges=merges, schedule=name,
        merger=getattr(merger, "name", "none") if merger is not None else "none",
        embedder=(embedder.name if embedder is not None else MEAN_EMBEDDER) if merges else "none",
        max_node_tokens=cap, seconds={"total": time.perf_counter() - t0})


def _prune(store: MemoryStore, keep: list[np.ndarray], name: str, t0: float) -> CompressResult:
    rows = np.sort(np.concatenate(keep)) if keep else np.zeros(0, dtype=np.int64)
    out = store.take(rows.tolist())
    return CompressResult(out, _report(store, out, name, t0), [])


# ------------------------------------------------------------------- pruning
def random_prune(store: MemoryStore, config: CompressConfig, **_) -> CompressResult:
    """Drop ``round(ratio * N_t)`` random nodes of each tenant."""
    t0 = time.perf_counter()
    seed = config.merge.seed
    keep = []
    for t, rows in _tenant_rows(store).items():
        drop = removal_target(len(rows), config.merge.ratio)
        keep.append(np.sort(_rng(seed, t).permutation(rows)[drop:]))
    return _prune(store, keep, "random_prune", t0)


def kmeans_prune(store: MemoryStore, config: CompressConfig, **_) -> CompressResult:
    """k-means (k-means++ seeding, ``partition.max_iter`` Lloyd steps) into the kept count
    of clusters per tenant; keep the member nearest each centroid."""
    t0 = time.perf_counter()
    seed = config.merge.seed
    keep = []
    for t, rows in _tenant_rows(store).items():
        n = len(rows)
        k = n - removal_target(n, config.merge.ratio)
        rng = _rng(seed, t)
        X = store.embeddings[torch.as_tensor(rows, device=store.device)][None]  # (1, n, D)
        valid = torch.ones(1, n, dtype=torch.bool, device=store.device)
        u = torch.from_numpy(rng.random((k, 1))).to(store.device)  # (k, 1) k-means++ draws
        labels, means, c_valid, _ = kmeans(X, valid, torch.tensor([k], device=store.device),
                                           max_iter=config.partition.max_iter, seeding="k-means++", uniforms=u)
        centre = cluster_centres(X, valid, labels, means, c_valid)[0]  # (k,)
        chosen = np.unique(centre[centre >= 0].cpu().numpy())
        if len(chosen) < k:  # clusters left empty: make up the count at random
            rest = np.setdiff1d(np.arange(n), chosen)
            chosen = np.concatenate([chosen, rng.permutation(rest)[: k - len(chosen)]])
        keep.append(rows[np.sort(chosen)])
    return _prune(store, keep, "kmeans_prune", t0)


def dart(store: MemoryStore, config: CompressConfig, **_) -> CompressResult:
    """Keep ``max(1, round(0.02 N))`` random pivots and the nodes least similar to them."""
    t0 = time.perf_counter()
    seed = config.merge.seed
    keep = []
    for t, rows in _tenant_rows(store).items():
        n = len(rows)
        k = n - removal_target(n, config.merge.ratio)
        p = min(k, max(1, int(np.floor(DART_PIVOTS * n + 0.5))))
        piv = _rng(seed, t).choice(n, size=p, replace=False)
        X = store.embeddings[torch.as_tensor(rows, device=store.device)]  # (n, D)
        sim = (X @ X[torch.as_tensor(piv, device=X.device)].T).amax(1).cpu().numpy()  # (n,)
        sim[piv] = -np.inf  # pivots are kept
        order = np.argsort(sim, kind="stable")  # least similar first, ties to the lower index
        keep.append(rows[np.sort(order[:k])])
    return _prune(store, keep, "dart", t0)


# ------------------------------------------------------------------- merging
class _Table(NodeTable):
    """The run's node table (the engine's bookkeeping) plus, per row, an embedding and
    (with a cap) a token count."""

    def __init__(self, store: MemoryStore, counter):
        super().__init__(store)
        self.emb = [store.embeddings[i] for i in range(len(store))]
        self.counter = counter
        self.tok = counter(self.texts) if counter is not None else None

    def merge_batch(self, pairs: list[tuple[int, int]], merger, fallback) -> list[int]:
        """Merge each pair (one merger call for all); returns the new rows (not embedded yet)."""
        ordered = [self.order(a, b) for a, b in pairs]
        batch = [self.merge_pair(o, n) for o, n in ordered]
        texts = merge_texts(merger, fallback, batch).texts  # the engine's fallback rules: never lose a memory
        new = []
        for (o, n), text in zip(ordered, texts):
            new.append(self.add(o, n, text))
            self.emb.append(torch.nn.functional.normalize(self.emb[o] + self.emb[n], dim=0))  # until re-embedded
        if self.tok is not None:
            self.tok.extend(self.counter([self.texts[j] for j in new]))
        return new

    def embed(self, rows: list[int], embedder) -> None:
        """Re-embed merged rows (without an embedder they keep the normalised mean of their
        inputs)."""
        if not rows or embedder is None:
            return
        E = embedder.embed([self.texts[j] for j in rows]).to(self.store.device, torch.float32)
        for j, e in zip(rows, E):
            self.emb[j] = e

    def output(self, live: list[int]) -> MemoryStore:
        rows = self.output_order(live)
        return self.to_store(rows, torch.stack([self.emb[j] for j in rows.tolist()]))


def _merging_setup(store: MemoryStore, config: CompressConfig, merger, embedder):
    """(merger, fallback, cap, table) of a merging baseline, by the engine's rules: the
    extractive merger by default and as the fallback; the cap ``max_node_tokens``, else the
    embedder's limit; token counts by the embedder's tokenizer when there is a cap."""
    merger, fallback = with_fallback(merger)
    cap, counter = cap_and_counter(config.merge.max_node_tokens, embedder)
    return merger, fallback, cap, _Table(store, counter)


def _fold(tab: _Table, groups: dict[int, list[int]], merger, fallback) -> tuple[dict[int, int], int, int]:
    """Merge each group's members into its target, one member per round (all targets of a
    round in one merger call). Returns ({target: final row}, merges, rounds)."""
    cur = {t: t for t in groups}
    merges = rounds = 0
    depth = max((len(m) for m in groups.values()), default=0)
    for r in range(depth):
        todo = [(t, groups[t][r]) for t in groups if len(groups[t]) > r]
        new = tab.merge_batch([(cur[t], m) for t, m in todo], merger, fallback)
        for (t, _), j in zip(todo, new):
            cur[t] = j
        merges += len(todo)
        rounds += 1
    return cur, merges, rounds


def _fits(tab: _Table, A: list[int], B: list[int], cap: int) -> torch.Tensor:
    """(nA, nB) bool: the merge of A[i] and B[j] stays under the cap (engine's estimate)."""
    tok = torch.tensor(tab.tok, dtype=torch.int64)
    day = utc_day(torch.tensor(tab.ts, dtype=torch.float64))
    a, b = torch.as_tensor(A), torch.as_tensor(B)
    return merged_length(tok[a][:, None], tok[b][None, :], day[a][:, None], day[b][None, :]) <= cap


def random_merge(store: MemoryStore, config: CompressConfig, *, merger=None, embedder=None, **_) -> CompressResult:
    """Merge each node of a random drop set (``round(ratio*N_t)``) into a random kept node."""
    t0 = time.perf_counter()
    merger, fallback, cap, tab = _merging_setup(store, config, merger, embedder)
    groups: dict[int, list[int]] = {}
    live: list[int] = []
    for t, rows in _tenant_rows(store).items():
        rng = _rng(config.merge.seed, t)
        perm = rng.permutation(rows)
        n_drop = removal_target(len(rows), config.merge.ratio)
        drop, keep = perm[:n_drop], perm[n_drop:]
        size = {int(k): (tab.tok[k] if tab.tok is not None else 0) for k in keep}
        for d in drop:
            d = int(d)
            if cap is None:
                k = int(keep[rng.integers(len(keep))])
            else:
                room = [kk for kk in size if size[kk] + tab.tok[d] + DATE_TAG_TOKENS <= cap]
                k = int(room[rng.integers(len(room))]) if room else min(size, key=size.get)
                size[k] += tab.tok[d] + DATE_TAG_TOKENS
            groups.setdefault(k, []).append(d)
        live.extend(int(k) for k in keep if int(k) not in groups)
    for k in groups:  # fold in time order
        groups[k].sort(key=lambda j: (tab.ts[j], j))
    final, merges, rounds = _fold(tab, groups, merger, fallback)
    tab.embed(list(final.values()), embedder)
    out = tab.output(live + list(final.values()))
    rep = _report(store, out, "random_merge", t0, merges=merges, rounds=rounds, merger=merger, embedder=embedder,
                  cap=cap)
    return CompressResult(out, rep, [])


def tome(store: MemoryStore, config: CompressConfig, *, merger=None, embedder=None, **_) -> CompressResult:
    """Bipartite soft matching (ToMe) passes until each tenant lost ``round(ratio*N_t)`` nodes."""
    t0 = time.perf_counter()
    merger, fallback, cap, tab = _merging_setup(store, config, merger, embedder)
    tenants = _tenant_rows(store)
    cur = {t: sorted(int(i) for i in rows) for t, rows in tenants.items()}  # live rows, in insertion order
    left = {t: removal_target(len(rows), config.merge.ratio) for t, rows in tenants.items()}
    merges = rounds = 0
    while True:
        groups: dict[int, list[int]] = {}
        for t, rows in cur.items():
            r = min(left[t], len(rows) // 2)
            if r <= 0:
                continue
            A, B = rows[0::2], rows[1::2]
            XA = torch.stack([tab.emb[j] for j in A])  # (nA, D)
            XB = torch.stack([tab.emb[j] for j in B])  # (nB, D)
            S = XA @ XB.T  # (nA, nB)
            if cap is not None:
                S = S.masked_fill(~_fits(tab, A, B, cap).to(S.device), float("-inf"))
            best, arg = S.max(1)  # (nA,) lowest B index on ties
            order = torch.argsort(best, descending=True, stable=True).tolist()
            size = {b: tab.tok[b] if tab.tok is not None else 0 for b in B}
            taken = 0
            for i in order:
                if taken == r or not torch.isfinite(best[i]):
                    break
                a, b = A[i], B[int(arg[i])]
                if cap is not None and size[b] + tab.tok[a] + DATE_TAG_TOKENS > cap and b in groups:
                    continue
                size[b] += tab.tok[a] + DATE_TAG_TOKENS if tab.tok is not None else 0
                groups.setdefault(b, []).append(a)
                taken += 1
            left[t] -= taken
        if not groups:
            break
        for b in groups:
            groups[b].sort(key=lambda j: (tab.ts[j], j))
        final, m, rr = _fold(tab, groups, merger, fallback)
        merges += m
        rounds += rr
        tab.embed(list(final.values()), embedder)
        gone = {a for ms in groups.values() for a in ms}
        for t in cur:
            cur[t] = sorted((final.get(j, j) for j in cur[t] if j not in gone), key=lambda j: tab.first[j])
    shortfall = {t: v for t, v in left.items() if v > 0}
    out = tab.output([j for rows in cur.values() for j in rows])
    rep = _report(store, out, "tome", t0, merges=merges, rounds=rounds, merger=merger, embedder=embedder, cap=cap,
                  shortfall=shortfall)
    return CompressResult(out, rep, [])


BASELINES = {"random_prune": random_prune, "kmeans_prune": kmeans_prune, "dart": dart,
             "random_merge": random_merge, "tome": tome}
