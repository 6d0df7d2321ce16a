"""StreamMeCo as a pruning baseline for graph memories (our reading of Wang et al., "StreamMeCo:
Long-Term Agent Memory Compression for Efficient Streaming Video Understanding", 2026, and
of the MemForest paper's description: a dual-branch strategy; every choice we had to make is
listed in docs/evaluation.md, "StreamMeCo: our reading").

Text nodes are split by their links to entities (faces, voices, ...):

- **isolated** nodes (no entity link) are reduced by representative sampling ("edge-free
  minmax sampling"): per sampling group (a clip, when nodes may only share a group; else the
  whole scope), k-means into ``ceil(cluster_ratio * n)`` clusters, each cluster keeps its share
  of the kept count (largest remainder, at least one node per cluster while the count allows):
  first its member nearest the centroid, then, one at a time, the member farthest (cosine
  distance) from the nearest already kept (farthest-first: a max-min, diverse sample);
- **linked** nodes are pruned by entity importance together with semantic similarity ("edge-
  aware weight pruning"): importance = the sum of a node's entity-link weights, redundancy =
  the sum of its cosines to the other linked nodes of its scope; both min-max normalised,
  ``score = alpha * importance + (1 - alpha) * (1 - redundancy)``; the lowest scores go.

Under the engine's rules, like every baseline: per scope (tenant; graph: tenant and node type)
exactly ``round(ratio * n)`` nodes go, ``n`` not counting the nodes of the keep rule (never
removed), split over the two branches by size (largest remainder). With sampling groups, every
group that had a removable node keeps at least one (M3-Agent truncates its memory at a clip
by the clip's last text node: a clip left without one would not be cut at all); a group
emptied by the quotas takes back its best node and the lowest-priority kept node of the same
scope in the group with the most kept nodes goes instead, so the count stays exact (short only
when every group is down to one node). On an M3-Agent video this holds per clip over both node
types (any text node lets M3-Agent cut there).
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np
import torch

from ..engine import CompressReport, CompressResult
from ..engine.partition import group_codes, kept_mask
from ..engine.quotas import allocate, removal_target
from ..kernels.lloyd import kmeans
from ..store.memory_store import MemoryStore
from ..timer import StageTimer

__all__ = ["StreamMeCoConfig", "streammeco_keep", "streammeco", "entity_links", "prune_report"]


@dataclass(frozen=True, kw_only=True)
class StreamMeCoConfig:
    """StreamMeCo's two knobs (defaults: the authors' released code)."""

    alpha: float = 0.1  # weight of entity importance against dissimilarity in the linked branch
    cluster_ratio: float = 0.05  # k-means clusters per isolated node, in each sampling group

    def __post_init__(self):
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1], got {self.alpha!r}")
        if not 0.0 < self.cluster_ratio <= 1.0:
            raise ValueError(f"cluster_ratio must be in (0, 1], got {self.cluster_ratio!r}")


def _minmax(x: np.ndarray) -> np.ndarray:
    lo, hi = float(x.min()), float(x.max())
    return np.ones_like(x) if hi <= lo else (x - lo) / (hi - lo)


def _linked_scores(E: torch.Tensor, importance: np.ndarray, alpha: float) -> np.ndarray:
    """Shape: E (m, D) unit rows, importance (m,) -> (m,) scores in [0, 1], high = keep."""
    sim = (E @ E.sum(0)).double().cpu().numpy()  # (m,) sum of cosines to every linked node
    return alpha * _minmax(importance.astype(np.float64)) + (1 - alpha) * (1 - _minmax(sim))


def _farthest_first(E: torch.Tensor, centre: torch.Tensor, keep: int) -> list[int]:
    """``keep`` rows of E: the nearest to ``centre``, then repeatedly the row whose cosine
    distance to its nearest chosen row is largest (ties: lowest index).
    Shape: E (m, D), centre (D,) -> list of ``keep`` row indices"""
    m = E.shape[0]
    if keep >= m:
        return list(range(m))
    if keep <= 0:
        return []
    first = int(torch.argmax(E @ centre))
    chosen = [first]
    gap = 1 - (E @ E[first])  # (m,) distance to the nearest chosen row
    gap[first] = -math.inf
    while len(chosen) < keep:
        j = int(torch.argmax(gap))
        chosen.append(j)
        gap = torch.minimum(gap, 1 - (E @ E[j]))
        gap[chosen] = -math.inf
    return chosen


def _sample_group(E: torch.Tensor, remove: int, rng: np.random.Generator, cfg: StreamMeCoConfig,
                  max_iter: int) -> np.ndarray:
    """Which of one sampling group's isolated rows stay. Shape: E (m, D) -> (m,) bool"""
    m = E.shape[0]
    keep = np.zeros(m, dtype=bool)
    K = max(1, min(m, math.ceil(cfg.cluster_ratio * m)))
    if K == 1:
        labels = np.zeros(m, dtype=np.int64)
        centres = torch.nn.functional.normalize(E.sum(0, keepdim=True), dim=1)  # (1, D)
    else:
        valid = torch.ones(1, m, dtype=torch.bool, device=E.device)
        u = torch.from_numpy(rng.random((K, 1))).to(E.device)  # (K, 1) k-means++ draws
        lab, means, _, _ = kmeans(E[None], valid, torch.tensor([K], device=E.device), max_iter=max_iter,
                                  seeding="k-means++", uniforms=u)
        labels = lab[0].cpu().numpy()
        centres = torch.nn.functional.normalize(means[0], dim=1)  # (K, D)
    sizes = np.bincount(labels, minlength=centres.shape[0])
    drop = allocate(remove, sizes, np.maximum(sizes - 1, 0))  # every cluster keeps one while it can
    drop += allocate(remove - int(drop.sum()), sizes, sizes - drop)
    for c in np.flatnonzero(sizes):
        rows = np.flatnonzero(labels == c)
        chosen = _farthest_first(E[torch.as_tensor(rows, device=E.device)], centres[c], int(sizes[c] - drop[c]))
        keep[rows[chosen]] = True
    return keep


def streammeco_keep(emb: torch.Tensor, scope: np.ndarray, importance: np.ndarray, linked: np.ndarray,
                    group: np.ndarray | None, protected: np.ndarray, *, ratio: float, seed: int = 0,
                    config: StreamMeCoConfig | None = None, max_iter: int = 30,
                    unit: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
    """Which nodes StreamMeCo keeps (see the module docstring) and the shortfall per scope.

    ``scope``: where the ratio holds (a tenant, or a tenant's node type); ``group``: the
    sampling groups (None: one per scope, and no group must keep a node); ``unit``: where
    every group keeps a node (default ``scope``; an M3-Agent video: its clips must keep a text
    node of any type), protected nodes counting as kept.

    Shape: emb (N, D) unit rows; scope, group, unit (N,) int codes; importance (N,) float;
    linked, protected (N,) bool -> keep (N,) bool, {scope code: shortfall}
    """
    cfg = config or StreamMeCoConfig()
    N = emb.shape[0]
    keep = np.ones(N, dtype=bool)
    prio = np.zeros(N, dtype=np.float64)
    grouped = group is not None
    group = np.zeros(N, dtype=np.int64) if group is None else np.asarray(group)
    for s in np.unique(scope).tolist():
        rows = np.flatnonzero((scope == s) & ~protected)
        n_drop = removal_target(len(rows), ratio)
        iso, lnk = rows[~linked[rows]], rows[linked[rows]]
        d_iso, d_lnk = allocate(n_drop, np.array([len(iso), len(lnk)]), np.array([len(iso), len(lnk)]))
        if len(lnk):
            score = _linked_scores(emb[torch.as_tensor(lnk, device=emb.device)], importance[lnk], cfg.alpha)
            prio[lnk] = score
            order = np.lexsort((lnk, -score))  # best first, ties to the lower row
            keep[lnk[order[len(lnk) - d_lnk:]]] = False
        if len(iso):
            rng = np.random.default_rng([int(seed), zlib.crc32(str(s).encode())])
            g_codes, g_sizes = np.unique(group[iso], return_counts=True)
            for g, r in zip(g_codes.tolist(), allocate(int(d_iso), g_sizes, g_sizes).tolist()):
                members = iso[group[iso] == g]
                E = emb[torch.as_tensor(members, device=emb.device)]
                prio[members] = (E @ torch.nn.functional.normalize(E.sum(0), dim=0)).double().cpu().numpy()
                keep[members] = _sample_group(E, r, rng, cfg, max_iter)
    short = {int(s): 0 for s in np.unique(scope).tolist()}
    if grouped:
        _one_per_group(keep, protected, np.asarray(scope), np.asarray(scope if unit is None else unit), group, prio,
                       short)
    return keep, short


def _one_per_group(keep: np.ndarray, protected: np.ndarray, scope: np.ndarray, unit: np.ndarray, group: np.ndarray,
                   prio: np.ndarray, short: dict) -> None:
    """Give every (unit, group) with a removable node a kept node, in place (see the module
    docstring): its best node comes back and, in the same scope, the lowest-priority kept node
    of the (unit, group) with the most kept nodes goes; ``short[scope]`` counts the removals
    given up when no group of the unit can spare one."""
    key = unit.astype(np.int64) * (int(group.max()) + 1) + group  # (N,) one code per (unit, group)
    for k in np.unique(key[~protected]).tolist():
        members = np.flatnonzero(key == k)
        if keep[members].any():
            continue
        back = members[~protected[members]]
        j = int(back[np.argmax(prio[back])])
        keep[j] = True
        kept_in = np.bincount(key[keep], minlength=int(key.max()) + 1)  # kept nodes per (unit, group)
        donors = np.flatnonzero(keep & ~protected & (scope == scope[j]) & (unit == unit[j]) & (kept_in[key] > 1))
        if len(donors) == 0:
            short[int(scope[j])] += 1
            continue
        donors = donors[kept_in[key[donors]] == kept_in[key[donors]].max()]
        keep[donors[np.lexsort((donors, prio[donors]))[0]]] = False  # lowest priority, then lowest row


def entity_links(metadata: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Each node's entity links from ``metadata["entities"]``: a list of entity ids (weight 1
    each) or a dict {entity id: weight}. Shape: -> weights (N,) float64 (their sum), linked
    (N,) bool"""
    weights = np.zeros(len(metadata), dtype=np.float64)
    linked = np.zeros(len(metadata), dtype=bool)
    for i, meta in enumerate(metadata):
        ents = (meta or {}).get("entities")
        if isinstance(ents, dict) and ents:
            weights[i], linked[i] = sum(float(w) for w in ents.values()), True
        elif isinstance(ents, (list, tuple)) and ents:
            weights[i], linked[i] = float(len(ents)), True
    return weights, linked


def streammeco(store: MemoryStore, config, *, config_smc: StreamMeCoConfig | None = None, **_) -> CompressResult:
    """StreamMeCo on a store whose nodes name their entities (``metadata["entities"]``): the
    harness's baseline. Scopes are tenants; ``merge.keep_pattern`` protects nodes and
    ``merge.merge_within`` names the sampling groups."""
    timer = StageTimer()
    weights, linked = entity_links(store.metadata)
    if not linked.any():
        raise ValueError("streammeco needs entity links: node metadata 'entities' (a list of entity ids or a dict "
                         "{id: weight}); this store has none")
    scope = np.asarray(store.tenant_codes_np)
    protected = (kept_mask(store.columns()["texts"], config.merge.keep_pattern) if config.merge.keep_pattern
                 else np.zeros(len(store), dtype=bool))
    group = group_codes(store, config.merge.merge_within) if config.merge.merge_within else None
    keep, short = streammeco_keep(store.embeddings, scope, weights, linked, group, protected,
                                  ratio=config.merge.ratio, seed=config.merge.seed, config=config_smc,
                                  max_iter=config.partition.max_iter)
    out = store.take(np.flatnonzero(keep).tolist())
    names = store.tenant_table
    return CompressResult(out, prune_report(store, out, "streammeco", timer, protected,
                                            {names[s]: v for s, v in short.items() if v}), [])


def prune_report(store: MemoryStore, out: MemoryStore, name: str, timer: StageTimer, protected: np.ndarray,
                 shortfall: dict) -> CompressReport:
    """The engine's report for a pruning run (no trees, merges or merger)."""
    n_in, n_out, n_kept = {}, {}, {}
    for t, p in zip(store.tenants, protected.tolist()):
        n_in[t] = n_in.get(t, 0) + 1
        n_kept[t] = n_kept.get(t, 0) + int(p)
    for t in out.tenants:
        n_out[t] = n_out.get(t, 0) + 1
    rows = [{"tenant": t, "nodes_in": n, "nodes_out": n_out.get(t, 0), "removed": n - n_out.get(t, 0),
             "requested": n - n_out.get(t, 0) + shortfall.get(t, 0), "ratio": (n - n_out.get(t, 0)) / n,
             "shortfall": shortfall.get(t, 0), "trees": 0, "kept": n_kept[t]} for t, n in n_in.items()]
    return CompressReport(tenants=rows, nodes_in=len(store), nodes_out=len(out), trees=0, rounds=0, merges=0,
                          schedule=name, merger="none", embedder="none", max_node_tokens=None,
                          seconds=timer.finish(), kept=int(protected.sum()))
