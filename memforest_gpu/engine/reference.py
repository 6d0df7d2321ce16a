"""A plain-Python reference of MemForest's whole merge order (docs/method.md sections 2-3).

Written from docs/method.md and the engine's documented conventions, not from its code paths:
lists, dicts and Python floats, numpy only to round to float32 where the engine stores
float32. It ships beside the fast path it checks: ``tests/test_merge_order.py`` compares it
merge for merge with :func:`memforest_gpu.compress`; ``bench/versus_reference.py`` times it.

Input: a store, a :class:`~memforest_gpu.CompressConfig`, a merger, and the partition
(``tree`` id per node, trees numbered tenant by tenant); by default the engine's own
:func:`~.partition.partition_nodes` is called as the engine calls it (k-means is out of
scope here). Only ``SpanningConfig(kind="max")`` is covered (the "min" and "random"
ablations raise ``ValueError``). No embedder: merged vectors are the normalised mean of
the two inputs.

Rules, in the order they apply:

1. **Quotas.** Tenant ``t`` of ``N_t`` nodes removes exactly ``floor(ratio * N_t + 0.5)``
   (:func:`removal_target`). It is split over the tenant's trees by
   :func:`largest_remainder` with weight = tree size and cap = size - 1.
   Whatever exceeds the caps is the tenant's shortfall.
2. **Slots.** A tree's nodes sit in slots ``0..n-1`` in time order ``(timestamp, row)``.
   A merge puts the merged node into the lower of the two slots and empties the other,
   so slot order never changes.
3. **Lengths** (with ``MergeConfig.max_node_tokens = cap`` or ``size_weight > 0``): an
   original's length is :func:`~memforest_gpu.mergers.embedders.count_words` of its text, a
   merged node's is ``count_words`` of the merger's output. The estimated length of merging
   ``a`` and ``b`` is ``tok_a + tok_b + 12`` if ``floor(ts_a / 86400) != floor(ts_b / 86400)``
   (the date tags, ``DATE_TAG_TOKENS``), else ``tok_a + tok_b``. A pair whose estimate
   is above ``cap`` is not an edge at all.
4. **Weights.** ``cos_ij`` = the exact dot product of the two float32 unit vectors, rounded
   to float32 (the engine accumulates in float64 and stores float32). The tree's weight
   ``w_ij`` is ``cos_ij``, then, in float32 arithmetic and in this order:
   with ``time_weight = tw > 0``, ``w = f32(1 - tw) * w + f32(tw) * [gap <= time_window] * g``,
   ``g`` by ``time_rule``: 1 (flat), ``max(cos, 0)`` (scaled), ``[cos >= f32(time_min_cos)]``
   (gated), where a node's span is the first and last position (rank in its tenant by
   ``(timestamp, row)``) of its originals and ``gap = max(lo_i, lo_j) - min(hi_i, hi_j)``;
   with ``size_weight = sw > 0``, ``w = w - f32(sw) * f32(est_ij) / f32(scale)``, ``scale``
   = ``SpanningConfig.size_unit`` (256 tokens by default, whatever the cap).
5. **Spanning tree** (every round, for every tree that still has quota, is not stuck and
   has >= 2 live nodes): Kruskal over the tree's edges sorted by ``(w desc, min slot asc,
   max slot asc)``, union-find skipping cycles: a maximum spanning forest when the cap
   removed edges.
6. **Score** of a forest edge, in float32 arithmetic:
   ``w' = f32(eta) * w - f32(1 - eta) * dsum`` with ``dsum = deg_i + deg_j`` (degree in the
   forest); with ``degree_norm="max"`` ``dsum`` is divided (float32) by
   ``max(1, largest dsum over the tree's forest edges)``.
7. **Pick.** Edges are ranked by ``(w' desc, min slot asc, max slot asc)``.
   ``sequential``: the tree's first edge. ``matching``: greedy disjoint pairs in that
   rank order, at most the tree's quota (as it was when the round was planned).
   A planned tree with no edge is *stuck* for good.
8. **Redistribution** (after planning a round, before applying it): for each tenant with
   stuck trees holding quota, that quota (of all its stuck trees) is set to zero and given
   to the tenant's non-stuck trees by :func:`largest_remainder` with weight = live node
   count and cap = ``max(0, count - 1 - quota)``; what does not fit adds to the shortfall.
   A round with no pairs is not counted; planning repeats while some tree still qualifies
   (rule 5), else merging ends.
9. **A merge** of nodes ``a, b``: older = smaller ``(timestamp, first original row)``; the
   merger gets ``MergePair(older, newer, tenant)``; merged node: vector = float32
   ``(v_a + v_b) / ||v_a + v_b||`` (norm correctly rounded), timestamp ``max``, sources
   ``sources_older + sources_newer``, id ``"mf-" + sha1("\\x1f".join(sorted(sources)))[:16]``,
   first original row = the smaller; quota and live count of the tree drop by one.
10. **Output**: live nodes ordered by their first original row.

Records: one dict per merge ``{round, tenant, a, b, into, similarity}`` (``a`` older id,
``b`` newer id, ``similarity`` = ``cos`` of the pair), rounds numbered from 1.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ..mergers.base import MemoryItem, MergePair
from ..mergers.embedders import count_words
from .partition import partition_nodes

__all__ = ["DATE_TAG_TOKENS", "removal_target", "largest_remainder", "kruskal", "RefResult", "reference_compress"]

DATE_TAG_TOKENS = 12
_DAY = 86400.0
_f32 = np.float32


def removal_target(n: int, ratio: float) -> int:
    """round(ratio * n) with halves up."""
    return int(math.floor(ratio * n + 0.5))


def largest_remainder(total: int, weights: list[float], caps: list[int]) -> list[int]:
    """Split ``min(total, sum(caps))`` in proportion to ``weights``, none above its cap.

    Repeated until all is given: every item with room gets ``floor(share)`` (at most its
    room) of ``share = remaining * w / sum(w over items with room)`` (equal weights when
    those sum to 0); the units still missing go one each to items with room left, by
    fraction ``share - floor(share)`` descending, ties to the lower index. Shares are exact
    rationals, so equal fractions are ties (float shares would break some ties by rounding).
    """
    n = len(weights)
    out = [0] * n
    remaining = min(int(total), sum(int(c) for c in caps))
    while remaining > 0:
        free = [caps[i] - out[i] > 0 for i in range(n)]
        w = [Fraction(weights[i]) if free[i] else Fraction(0) for i in range(n)]
        if sum(w) <= 0:
            w = [Fraction(1 if f else 0) for f in free]
        total_w = sum(w)
        share = [remaining * w[i] / total_w for i in range(n)]
        base = [min(math.floor(share[i]), caps[i] - out[i]) for i in range(n)]
        for i in range(n):
            out[i] += base[i]
        left = remaining - sum(base)
        cand = [i for i in range(n) if caps[i] - out[i] > 0]
        cand.sort(key=lambda i: (-(share[i] - math.floor(share[i])), i))
        give = cand[:left]
        for i in give:
            out[i] += 1
        remaining -= sum(base) + len(give)
    return out


def kruskal(n_slots: int, edges: list[tuple[float, int, int]]) -> list[tuple[int, int, float]]:
    """Maximum spanning forest: ``edges`` (w, i, j) with i < j, taken by (w desc, i, j)."""
    parent = list(range(n_slots))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    out = []
    for w, i, j in sorted(edges, key=lambda e: (-e[0], e[1], e[2])):
        ri, rj = find(i), find(j)
        if ri != rj:
            parent[ri] = rj
            out.append((i, j, w))
    return out


def _merged_id(sources: list[str]) -> str:
    return "mf-" + hashlib.sha1("\x1f".join(sorted(sources)).encode("utf-8")).hexdigest()[:16]


def _cosine(x: np.ndarray, y: np.ndarray) -> float:
    """Exact dot product of two float32 vectors, rounded to float32."""
    return float(_f32(math.fsum(float(a) * float(b) for a, b in zip(x.tolist(), y.tolist()))))


def _mean_vector(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    s = (x + y).astype(np.float32)  # float32 sum
    norm = _f32(math.sqrt(math.fsum(float(v) * float(v) for v in s.tolist())))
    return (s / max(norm, _f32(1e-12))).astype(np.float32)


@dataclass
class RefResult:
    merges: list[dict]  # {round, tenant, a, b, into, similarity}
    ids: list[str]  # output store, in output order
    sources: list[list[str]]
    texts: list[str]
    timestamps: list[float]
    tenants: list[str]
    embeddings: np.ndarray  # (N_out, D) float32
    shortfall: dict  # tenant -> nodes it could not remove
    rounds: int
    moved: int  # quota units stuck trees handed to other trees (rule 8)
    replans: int  # planning passes that found no pair but handed quota on (rule 8)


class _Nodes:
    """Every node of the run; originals are rows 0..N-1, merged nodes are appended."""

    def __init__(self, store, tokens):
        self.ids = list(store.ids)
        self.texts = list(store.texts)
        self.ts = [float(t) for t in store.timestamps.tolist()]
        self.tenant = list(store.tenants)
        self.sources = [list(s) for s in store.sources]
        self.first = list(range(len(store)))
        self.lo = _tenant_positions(self.tenant, self.ts)  # span of positions of the originals inside
        self.hi = list(self.lo)
        self.vec = list(store.embeddings.detach().cpu().numpy().astype(np.float32))
        self.tok = tokens
        self._cos: dict[tuple[int, int], float] = {}

    def cos(self, a: int, b: int) -> float:
        k = (a, b) if a < b else (b, a)
        if k not in self._cos:
            self._cos[k] = _cosine(self.vec[a], self.vec[b])
        return self._cos[k]

    def est(self, a: int, b: int) -> int:
        tag = DATE_TAG_TOKENS if math.floor(self.ts[a] / _DAY) != math.floor(self.ts[b] / _DAY) else 0
        return self.tok[a] + self.tok[b] + tag

    def merge(self, a: int, b: int, merger) -> tuple[int, int, int]:
        """Merge rows a, b; returns (older, newer, new row)."""
        older, newer = (a, b) if (self.ts[a], self.first[a]) <= (self.ts[b], self.first[b]) else (b, a)
        pair = MergePair(MemoryItem(self.ids[older], self.texts[older], self.ts[older]),
                         MemoryItem(self.ids[newer], self.texts[newer], self.ts[newer]), self.tenant[older])
        (text,) = merger.merge([pair])
        src = self.sources[older] + self.sources[newer]
        self.ids.append(_merged_id(src))
        self.texts.append(text)
        self.ts.append(max(self.ts[older], self.ts[newer]))
        self.tenant.append(self.tenant[older])
        self.sources.append(src)
        self.first.append(min(self.first[older], self.first[newer]))
        self.lo.append(min(self.lo[older], self.lo[newer]))
        self.hi.append(max(self.hi[older], self.hi[newer]))
        self.vec.append(_mean_vector(self.vec[older], self.vec[newer]))
        if self.tok is not None:
            self.tok.append(count_words([text])[0])
        return older, newer, len(self.ids) - 1


def _tenant_positions(tenants: list[str], ts: list[float]) -> list[int]:
    """Each node's rank among its tenant's nodes by (timestamp, row)."""
    pos = [0] * len(ts)
    seen: dict[str, int] = {}
    for i in sorted(range(len(ts)), key=lambda i: (ts[i], i)):
        pos[i] = seen.get(tenants[i], 0)
        seen[tenants[i]] = pos[i] + 1
    return pos


def _given_partition(store, tree, code: dict[str, int]) -> tuple[list[int], list[int]]:
    """``tree`` as a list, and each tree's tenant code (a tree must hold one tenant's nodes)."""
    tree = [int(x) for x in tree]
    tree_tenant = [-1] * (max(tree) + 1)
    for i, t in enumerate(tree):
        if tree_tenant[t] not in (-1, code[store.tenants[i]]):
            raise ValueError(f"tree {t} must hold one tenant's nodes, got {store.tenants[i]!r} too")
        tree_tenant[t] = code[store.tenants[i]]
    return tree, tree_tenant


def _default_partition(store, config) -> tuple[list[int], list[int]]:
    names, codes = store.tenant_index()
    part = partition_nodes(store.embeddings, store.timestamps, codes, names, config.partition)
    return part.tree.tolist(), part.tree_tenant.tolist()


def reference_compress(store, config, merger, *, tree: list[int] | None = None) -> RefResult:
    """Run MemForest's merge order on ``store`` with plain Python (rules: module docstring).

    ``tree``: tree id per node (ids ``0..T-1``, every tree inside one tenant, numbered in
    the order quotas break ties); ``None`` calls the engine's partition.
    """
    sp, mc = config.spanning, config.merge
    if sp.kind != "max":
        raise ValueError(f"spanning kind must be 'max' here, got {sp.kind!r}")
    names = store.tenant_names()
    code = {t: j for j, t in enumerate(names)}
    tree, tree_tenant = _default_partition(store, config) if tree is None else _given_partition(store, tree, code)
    n_trees = len(tree_tenant)
    cap = mc.max_node_tokens
    nodes = _Nodes(store, count_words(store.texts) if cap is not None or sp.size_weight > 0 else None)
    weight = _edge_weight(sp, cap, nodes)

    # slots: a tree's nodes in (timestamp, row) order
    slots: list[list[int | None]] = [[] for _ in range(n_trees)]
    for i in sorted(range(len(store)), key=lambda i: (nodes.ts[i], i)):
        slots[tree[i]].append(i)
    count = [len(s) for s in slots]

    # quotas: exact per tenant, by tree size
    trees_of = [[k for k in range(n_trees) if tree_tenant[k] == t] for t in range(len(names))]
    quota = [0] * n_trees
    shortfall = [0] * len(names)
    for t, trs in enumerate(trees_of):
        target = removal_target(sum(count[k] for k in trs), mc.ratio)
        q = largest_remainder(target, [count[k] for k in trs], [count[k] - 1 for k in trs])
        for k, x in zip(trs, q):
            quota[k] = x
        shortfall[t] = target - sum(q)
    stuck = [False] * n_trees
    moved = replans = 0

    eta = _f32(sp.eta)
    one_minus_eta = _f32(1 - sp.eta)
    records: list[dict] = []
    rounds = 0
    while True:
        plan = []  # (tree, slot_a, slot_b, w)
        for k in range(n_trees):
            if quota[k] <= 0 or stuck[k] or count[k] < 2:
                continue
            pairs = _plan_tree(slots[k], nodes, cap, weight, eta, one_minus_eta, sp.degree_norm, mc.schedule,
                               quota[k])
            if not pairs:
                stuck[k] = True
            plan += [(k,) + p for p in pairs]
        moved += _redistribute(stuck, quota, count, tree_tenant, trees_of, shortfall)
        if not plan:
            if any(quota[k] > 0 and not stuck[k] and count[k] >= 2 for k in range(n_trees)):
                replans += 1
                continue
            break
        rounds += 1
        for k, sa, sb, w in plan:
            older, newer, new = nodes.merge(slots[k][sa], slots[k][sb], merger)
            slots[k][min(sa, sb)] = new
            slots[k][max(sa, sb)] = None
            quota[k] -= 1
            count[k] -= 1
            records.append({"round": rounds, "tenant": nodes.tenant[new], "a": nodes.ids[older],
                            "b": nodes.ids[newer], "into": nodes.ids[new], "similarity": w})

    live = sorted((r for s in slots for r in s if r is not None), key=lambda r: nodes.first[r])
    return RefResult(
        merges=records, ids=[nodes.ids[r] for r in live], sources=[nodes.sources[r] for r in live],
        texts=[nodes.texts[r] for r in live], timestamps=[nodes.ts[r] for r in live],
        tenants=[nodes.tenant[r] for r in live],
        embeddings=np.stack([nodes.vec[r] for r in live]) if live else np.zeros((0, store.dim), np.float32),
        shortfall={names[t]: shortfall[t] for t in range(len(names))}, rounds=rounds, moved=moved,
        replans=replans)


def _edge_weight(sp, cap, nodes: _Nodes):
    """The spanning tree's edge weight of two rows (rule 4), as a float32 value."""
    tw, sw = sp.time_weight, sp.size_weight
    scale = _f32(sp.size_unit)

    def weight(a: int, b: int):
        w = _f32(nodes.cos(a, b))
        if tw > 0:
            gap = max(nodes.lo[a], nodes.lo[b]) - min(nodes.hi[a], nodes.hi[b])
            near = gap <= sp.time_window
            if sp.time_rule == "scaled":
                bonus = _f32(near) * max(w, _f32(0))
            elif sp.time_rule == "gated":
                bonus = _f32(near and w >= _f32(sp.time_min_cos))
            else:  # flat
                bonus = _f32(near)
            w = _f32(1 - tw) * w + _f32(tw) * bonus
        if sw > 0:
            w = w - _f32(sw) * _f32(nodes.est(a, b)) / scale
        return w

    return weight


def _plan_tree(slot_rows, nodes: _Nodes, cap, weight, eta, one_minus_eta, degree_norm, schedule, quota):
    """This round's pairs of one tree: [(slot_a, slot_b, cos)] with slot_a < slot_b."""
    live = [s for s, r in enumerate(slot_rows) if r is not None]
    edges = []
    for x, i in enumerate(live):
        for j in live[x + 1:]:
            a, b = slot_rows[i], slot_rows[j]
            if cap is not None and nodes.est(a, b) > cap:
                continue  # over the cap: no edge
            edges.append((weight(a, b), i, j))
    forest = kruskal(len(slot_rows), edges)
    if not forest:
        return []
    deg = [0] * len(slot_rows)
    for i, j, _ in forest:
        deg[i] += 1
        deg[j] += 1
    dsum = [_f32(deg[i] + deg[j]) for i, j, _ in forest]
    if degree_norm == "max":
        dmax = max(max(dsum), _f32(1))
        dsum = [_f32(d / dmax) for d in dsum]
    ranked = sorted(((eta * _f32(w) - one_minus_eta * d, i, j, nodes.cos(slot_rows[i], slot_rows[j]))
                     for (i, j, w), d in zip(forest, dsum)), key=lambda e: (-e[0], e[1], e[2]))
    if schedule == "sequential":
        _, i, j, w = ranked[0]
        return [(i, j, w)]
    used: set[int] = set()
    out = []
    for _, i, j, w in ranked:
        if len(out) == quota:
            break
        if i not in used and j not in used:
            used.update((i, j))
            out.append((i, j, w))
    return out


def _redistribute(stuck, quota, count, tree_tenant, trees_of, shortfall) -> int:
    """Rule 8; returns the quota units given to other trees."""
    moved = 0
    for t in sorted({tree_tenant[k] for k in range(len(quota)) if stuck[k] and quota[k] > 0}):
        trs = trees_of[t]
        give = sum(quota[k] for k in trs if stuck[k])
        for k in trs:
            if stuck[k]:
                quota[k] = 0
        recv = [k for k in trs if not stuck[k]]
        add = largest_remainder(give, [count[k] for k in recv], [max(0, count[k] - 1 - quota[k]) for k in recv])
        for k, x in zip(recv, add):
            quota[k] += x
        shortfall[t] += give - sum(add)
        moved += sum(add)
    return moved
