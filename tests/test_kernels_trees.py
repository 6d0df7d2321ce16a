"""Kernel tests: spanning trees, tree degrees, merge-pair selection, padding.

Each kernel is checked against an independent, deliberately simple reference; how the
references and the tie-exact inputs are built is in tests/kernel_helpers.py.
"""
from __future__ import annotations

from collections import Counter

import networkx as nx
import numpy as np
import pytest
import torch
from kernel_helpers import SIZES, N, T, _one_cpu_thread, kruskal_ref  # noqa: F401 (autouse fixture)

from memforest_gpu.kernels.matching import best_edge_per_tree, greedy_matching
from memforest_gpu.kernels.mst import spanning_degrees, spanning_forest
from memforest_gpu.kernels.padding import pack_segments, size_buckets, unpack_segments

# ----------------------------------------------------------------------------------------------
# 1-2. spanning_forest / spanning_degrees
# ----------------------------------------------------------------------------------------------

def networkx_ref(W: np.ndarray, active: np.ndarray, maximum: bool = True) -> set:
    """networkx Kruskal; edges are inserted in (min, max) ascending order so its stable sort
    resolves equal weights exactly as docs/method.md does."""
    m = W.shape[0]
    act = [i for i in range(m) if active[i]]
    G = nx.Graph()
    G.add_nodes_from(act)
    for a, i in enumerate(act):
        for j in act[a + 1:]:
            G.add_edge(i, j, weight=float(W[i, j]))
    f = nx.maximum_spanning_tree if maximum else nx.minimum_spanning_tree
    Tr = f(G, algorithm="kruskal")
    return {(min(a, b), max(a, b)) for a, b in Tr.edges()}


def tied_weights(rng, B: int, m: int, kind: str) -> np.ndarray:
    """Symmetric (B, m, m) weights; the diagonal holds a huge value that must be ignored."""
    if kind == "quarters":  # multiples of 1/4 in [-1, 1]: heavy ties, exact in float32
        A = np.round(rng.uniform(-1, 1, (B, m, m)) * 4) / 4
    elif kind == "const":  # every edge ties
        A = np.full((B, m, m), 0.5)
    elif kind == "cos_dup":  # cosine of rounded, partly duplicated vectors
        X = rng.integers(-2, 3, (B, m, 3)).astype(np.float64)
        X[X.sum(-1) == 0] = 1.0
        if m > 2:
            X[:, m // 2:] = X[:, : m - m // 2][:, : m - m // 2]
        X /= np.linalg.norm(X, axis=-1, keepdims=True)
        A = X @ X.transpose(0, 2, 1)
    else:  # continuous
        A = rng.standard_normal((B, m, m))
    W = np.triu(A, 1)
    W = W + W.transpose(0, 2, 1)
    idx = np.arange(m)
    W[:, idx, idx] = 1e6
    return W


def active_masks(rng, B: int, m: int) -> np.ndarray:
    act = rng.random((B, m)) < 0.75
    act[0] = True
    if B > 1:
        act[1] = False  # a graph with no vertex
    if B > 2:
        act[2] = False
        act[2, rng.integers(m)] = True  # a single vertex
    return act


@pytest.mark.parametrize("kind,dtype", [("quarters", torch.float64), ("quarters", torch.float32),
                                        ("cos_dup", torch.float64), ("cos_dup", torch.float32),
                                        ("const", torch.float32), ("random", torch.float64)])
@pytest.mark.parametrize("m", SIZES)
def test_spanning_forest_matches_kruskal_and_networkx(device, m, kind, dtype):
    rng = np.random.default_rng(1000 * m + len(kind))
    B = 5 if m <= 31 else 2
    W = tied_weights(rng, B, m, kind)
    W = N(torch.as_tensor(W).to(dtype)).astype(np.float64)  # the exact values the kernel sees
    act = active_masks(rng, B, m)
    Wt, At = T(W, device, dtype), T(act, device)
    for maximum in (True, False):
        u, v, w, valid = spanning_forest(Wt, At, maximum=maximum)
        E = max(m - 1, 0)
        assert u.shape == v.shape == w.shape == valid.shape == (B, E)
        assert u.dtype == v.dtype == torch.int64 and valid.dtype == torch.bool and w.dtype == dtype
        assert u.device.type == torch.device(device).type
        u_, v_, w_, ok = N(u), N(v), N(w), N(valid)
        for b in range(B):
            n_act = int(act[b].sum())
            k = int(ok[b].sum())
            assert k == max(n_act - 1, 0)
            assert ok[b, :k].all() and not ok[b, k:].any()  # valid edges first
            got = list(zip(u_[b, :k].tolist(), v_[b, :k].tolist()))
            assert all(a < c for a, c in got)
            assert all(act[b, a] and act[b, c] for a, c in got)
            keys = [a * m + c for a, c in got]
            assert keys == sorted(keys) and len(set(keys)) == k  # sorted by tie key
            assert len(set(got)) == k
            ref = kruskal_ref(W[b], act[b], maximum)
            assert set(got) == ref
            assert set(got) == networkx_ref(W[b], act[b], maximum)
            np.testing.assert_array_equal(w_[b, :k], W[b, u_[b, :k], v_[b, :k]])  # exactly W at the edges


def test_spanning_forest_all_ties_is_star_at_zero(device):
    # every weight equal: Kruskal takes (0,1), (0,2), ... first, a star centred on vertex 0
    m = 9
    W = torch.ones(2, m, m, dtype=torch.float64, device=device)
    act = torch.ones(2, m, dtype=torch.bool, device=device)
    act[1, 0] = False  # without 0 the star is centred on 1
    u, v, w, ok = spanning_forest(W, act)
    assert N(u[0]).tolist() == [0] * (m - 1) and N(v[0]).tolist() == list(range(1, m))
    assert N(u[1, : m - 2]).tolist() == [1] * (m - 2) and N(v[1, : m - 2]).tolist() == list(range(2, m))
    assert N(ok[1]).tolist() == [True] * (m - 2) + [False]


def test_spanning_forest_empty_and_single(device):
    for B, m in [(0, 5), (3, 0), (3, 1), (0, 0)]:
        u, v, w, ok = spanning_forest(torch.zeros(B, m, m, device=device), torch.ones(B, m, dtype=torch.bool,
                                                                                      device=device))
        assert u.shape == (B, max(m - 1, 0)) and not bool(ok.any())
    # m = 2: one edge when both are active, none otherwise
    W = torch.tensor([[[0.0, -3.0], [-3.0, 0.0]]] * 3, device=device)
    act = torch.tensor([[True, True], [True, False], [False, False]], device=device)
    u, v, w, ok = spanning_forest(W, act)
    assert N(ok).ravel().tolist() == [True, False, False]
    assert (int(u[0, 0]), int(v[0, 0]), float(w[0, 0])) == (0, 1, -3.0)


@pytest.mark.parametrize("m", SIZES)
def test_spanning_degrees_counts(device, m):
    rng = np.random.default_rng(m)
    B = 4
    W = tied_weights(rng, B, m, "quarters")
    act = active_masks(rng, B, m)
    u, v, w, ok = spanning_forest(T(W, device), T(act, device))
    deg = spanning_degrees(u, v, ok, m)
    assert deg.shape == (B, m) and deg.dtype == torch.int64
    for b in range(B):
        c = Counter()
        for a, bb, o in zip(N(u[b]).tolist(), N(v[b]).tolist(), N(ok[b]).tolist()):
            if o:
                c[a] += 1
                c[bb] += 1
        assert N(deg[b]).tolist() == [c[i] for i in range(m)]
    # padding edges are ignored even when they point at real vertices
    uu = T([[0, 2, 1, 0]], device)
    vv = T([[1, 3, 2, 3]], device)
    okk = T([[True, True, False, False]], device)
    assert N(spanning_degrees(uu, vv, okk, 5)).tolist() == [[1, 1, 1, 1, 0]]


# ----------------------------------------------------------------------------------------------
# 6. greedy_matching / best_edge_per_tree
# ----------------------------------------------------------------------------------------------

def random_tree(rng, m):
    perm = rng.permutation(m)
    return [(int(min(perm[i], perm[p])), int(max(perm[i], perm[p])))
            for i in range(1, m) for p in [int(rng.integers(0, i))]]


def edge_batch(rng, ms, graph="tree"):
    """Padded (B, E) edge lists in shuffled slot order, rounded scores (ties), keys = min*m + max,
    ~20% of real edges ineligible, padding slots u = v = 0 and ineligible."""
    mmax = max(ms)
    lists = []
    for m in ms:
        if graph == "tree":
            es = random_tree(rng, m)
        else:
            es = [(i, j) for i in range(m) for j in range(i + 1, m) if rng.random() < 0.4]
        lists.append([es[i] for i in rng.permutation(len(es))])
    E = max(1, max(len(es) for es in lists))
    B = len(ms)
    u = np.zeros((B, E), dtype=np.int64)
    v = np.zeros((B, E), dtype=np.int64)
    ok = np.zeros((B, E), dtype=bool)
    score = np.round(rng.uniform(-0.3, 0.5, (B, E)), 1)  # many equal scores
    for b, es in enumerate(lists):
        for e, (a, c) in enumerate(es):
            u[b, e], v[b, e] = a, c
            ok[b, e] = rng.random() < 0.8
    score[~ok] = 9.0  # ineligible edges look best: they must never be picked
    key = np.minimum(u, v) * mmax + np.maximum(u, v)
    return u, v, score, key, ok, mmax


def greedy_ref(u, v, score, key, ok, cap=None):
    """Edges by (score desc, key asc); take an edge when both endpoints are free; stop after cap."""
    es = sorted((e for e in range(len(u)) if ok[e]), key=lambda e: (-score[e], key[e]))
    used, picked = set(), set()
    for e in es:
        if cap is not None and len(picked) >= cap:
            break
        if u[e] not in used and v[e] not in used:
            picked.add(e)
            used |= {u[e], v[e]}
    return picked


@pytest.mark.parametrize("graph", ["tree", "graph"])
@pytest.mark.parametrize("m", SIZES)
def test_greedy_matching(device, m, graph):
    rng = np.random.default_rng(m * 7 + len(graph))
    ms = [m, max(1, m // 2), 1, m]
    u, v, score, key, ok, mmax = edge_batch(rng, ms, graph)
    B = len(ms)
    ok[3] = False  # a tree with no eligible edge
    args = [T(a, device) for a in (u, v, score, key, ok)]
    caps = {"none": None, "zero": np.zeros(B, dtype=np.int64), "one": np.ones(B, dtype=np.int64),
            "rand": rng.integers(0, m + 1, B), "big": np.full(B, 10 ** 6)}
    for name, cap in caps.items():
        got = N(greedy_matching(*args, mmax, cap=None if cap is None else T(cap, device)))
        assert got.shape == u.shape and got.dtype == bool
        for b in range(B):
            ref = greedy_ref(u[b], v[b], score[b], key[b], ok[b], None if cap is None else int(cap[b]))
            assert set(np.nonzero(got[b])[0].tolist()) == ref, (name, b)
        assert not got[3].any()


def test_greedy_matching_on_spanning_forest_scores(device):
    # the engine's use: MST edges, degree-adjusted scores with ties, padded edges
    rng = np.random.default_rng(2)
    B, m = 6, 31
    W = tied_weights(rng, B, m, "quarters")
    act = active_masks(rng, B, m)
    u, v, w, ok = spanning_forest(T(W, device), T(act, device))
    deg = spanning_degrees(u, v, ok, m)
    score = 0.99 * w - 0.01 * (deg.gather(1, u) + deg.gather(1, v)).to(w.dtype)
    key = torch.minimum(u, v) * m + torch.maximum(u, v)
    cap = T(rng.integers(0, 8, B), device)
    got = N(greedy_matching(u, v, score, key, ok, m, cap=cap))
    bi = N(best_edge_per_tree(score, key, ok))
    for b in range(B):
        a = [N(x[b]) for x in (u, v, score, key, ok)]
        assert set(np.nonzero(got[b])[0].tolist()) == greedy_ref(*a, int(cap[b]))
        ref_best = min((e for e in range(m - 1) if a[4][e]), key=lambda e: (-a[2][e], a[3][e]), default=-1)
        assert bi[b] == ref_best


@pytest.mark.parametrize("m", SIZES)
def test_best_edge_per_tree(device, m):
    rng = np.random.default_rng(m + 3)
    ms = [m, m, max(1, m // 3), 1]
    u, v, score, key, ok, _ = edge_batch(rng, ms)
    ok[1] = False  # nothing eligible -> -1
    got = N(best_edge_per_tree(*(T(a, device) for a in (score, key, ok))))
    for b in range(len(ms)):
        es = [e for e in range(u.shape[1]) if ok[b, e]]
        ref = max(es, key=lambda e: (score[b, e], -key[b, e])) if es else -1
        assert got[b] == ref
    assert got[1] == -1
    empty = best_edge_per_tree(torch.zeros(2, 0, device=device), torch.zeros(2, 0, dtype=torch.int64, device=device),
                               torch.zeros(2, 0, dtype=torch.bool, device=device))
    assert N(empty).tolist() == [-1, -1]



# ----------------------------------------------------------------------------------------------
# 8. padding
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("with_order", [False, True])
@pytest.mark.parametrize("n", [0] + SIZES)
def test_pack_unpack_round_trip(device, n, with_order):
    rng = np.random.default_rng(n + 100 * with_order)
    S = 5
    seg = rng.integers(0, S - 1, n)  # segment S-1 is empty
    order = rng.permutation(n) if with_order else None
    index, valid, sizes = pack_segments(T(seg, device, torch.int64), S,
                                        order=None if order is None else T(order, device, torch.int64))
    index, valid, sizes = N(index), N(valid), N(sizes)
    width = max([1] + [int((seg == s).sum()) for s in range(S)])
    assert index.shape == valid.shape == (S, width)
    rank = np.empty(n, dtype=np.int64)
    rank[order if order is not None else np.arange(n)] = np.arange(n)
    for s in range(S):
        items = sorted(np.nonzero(seg == s)[0].tolist(), key=lambda i: rank[i])
        assert sizes[s] == len(items)
        assert index[s, : len(items)].tolist() == items
        assert (index[s, len(items):] == -1).all()
    np.testing.assert_array_equal(valid, index >= 0)
    vals = rng.standard_normal((n, 3))
    packed = np.zeros(index.shape + (3,))
    packed[valid] = vals[index[valid]]
    back = unpack_segments(T(packed, device), T(index, device), n, fill=7.0)
    np.testing.assert_array_equal(N(back), vals)
    ids = unpack_segments(T(index, device), T(index, device), n, fill=-5)
    np.testing.assert_array_equal(N(ids), np.arange(n))


@pytest.mark.parametrize("min_size", [1, 2, 3])
def test_size_buckets(device, min_size):
    rng = np.random.default_rng(min_size)
    sizes = np.concatenate([rng.integers(0, 300, 60), [0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 100]])
    buckets = size_buckets(T(sizes, device, torch.int64), min_size=min_size)
    seen = [int(i) for b in buckets for i in N(b)]
    assert sorted(seen) == sorted(np.nonzero(sizes >= min_size)[0].tolist())  # each kept segment exactly once
    assert len(seen) == len(set(seen))
    tops = []
    for b in buckets:
        assert b.device.type == torch.device(device).type
        sz = sizes[N(b)]
        assert len(sz) > 0
        assert sz.max() < 2 * sz.min()  # padding to the bucket's largest wastes < 2x
        assert len(sz) * sz.max() < 2 * sz.sum()
        tops.append(sz.max())
    assert tops == sorted(tops, reverse=True)
    assert size_buckets(T([0, 0], device, torch.int64), min_size=1) == []
