"""Kernel tests for sparse trees: the spanning forest over an edge list, and the
nearest-neighbour candidates (exact blockwise and in cells).

References are plain Python written from docs/method.md section 2 (Kruskal with the (weight desc,
(min, max) asc) order, networkx) and brute force; integer outputs are compared exactly.
Weights that must tie are multiples of 1/4 or dyadic dot products, exact in float32.
"""
from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import torch
from kernel_helpers import SIZES, N, T, _one_cpu_thread  # noqa: F401 (autouse fixture)

from memforest_gpu.engine.reference import kruskal
from memforest_gpu.kernels.edge_mst import edge_forest
from memforest_gpu.kernels.knn import balanced_cells, knn_blockwise, knn_cells, order_key, top_by_key
from memforest_gpu.kernels.mst import spanning_forest


def forest_pairs(u, v, owner) -> list[tuple[int, int]]:
    e = owner[owner >= 0]
    return [(int(min(u[i], v[i])), int(max(u[i], v[i]))) for i in e]


def kruskal_edges(u, v, w, n, maximum=True) -> set:
    """Kruskal as docs/method.md orders it, on an edge list (parallel copies share a weight; -inf / +inf = no edge)."""
    bad = -np.inf if maximum else np.inf
    es = {(min(a, b), max(a, b)): x for a, b, x in zip(u.tolist(), v.tolist(), w.tolist()) if a != b and x != bad}
    sign = 1.0 if maximum else -1.0
    return {(i, j) for i, j, _ in kruskal(n, [(sign * x, i, j) for (i, j), x in es.items()])}


def networkx_edges(u, v, w, n, maximum=True) -> set:
    bad = -np.inf if maximum else np.inf
    es = {(min(a, b), max(a, b)): x for a, b, x in zip(u.tolist(), v.tolist(), w.tolist()) if a != b and x != bad}
    G = nx.Graph()
    G.add_nodes_from(range(n))
    for (i, j) in sorted(es):  # inserted in (min, max) order: networkx's stable sort breaks ties as docs/method.md
        G.add_edge(i, j, weight=es[(i, j)])
    f = nx.maximum_spanning_tree if maximum else nx.minimum_spanning_tree
    return {(min(a, b), max(a, b)) for a, b in f(G, algorithm="kruskal").edges()}


def random_graphs(rng, sizes, density, kind="quarters"):
    """Several graphs with global vertex ids, shuffled edges, parallel copies (both
    directions, same weight), self loops and no-edges (-inf)."""
    us, vs, ws, n = [], [], [], 0
    for m in sizes:
        E = int(density * m * max(m - 1, 0) / 2) + 1
        a, b = rng.integers(0, max(m, 1), E), rng.integers(0, max(m, 1), E)
        if kind == "quarters":
            x = np.round(rng.uniform(-1, 1, E) * 4) / 4
        elif kind == "const":
            x = np.full(E, 0.5)
        else:
            x = rng.standard_normal(E)
        pair = {}
        for i in range(E):  # one weight per pair
            x[i] = pair.setdefault((min(a[i], b[i]), max(a[i], b[i])), x[i])
        x[rng.random(E) < 0.1] = -np.inf
        us += (n + a).tolist() + (n + b[: E // 3]).tolist()
        vs += (n + b).tolist() + (n + a[: E // 3]).tolist()
        ws += x.tolist() + x[: E // 3].tolist()
        n += m
    perm = rng.permutation(len(us))
    return np.array(us)[perm], np.array(vs)[perm], np.array(ws)[perm], n


@pytest.mark.parametrize("kind", ["quarters", "const", "random"])
@pytest.mark.parametrize("m", SIZES)
def test_edge_forest_matches_kruskal_and_networkx(device, m, kind):
    rng = np.random.default_rng(100 * m + len(kind))
    sizes = [m, max(1, m // 2), 1, m + 2] if m <= 31 else [m, m // 3]
    for density in (0.15, 0.6, 1.0):
        u, v, w, n = random_graphs(rng, sizes, density, kind)
        for maximum in (True, False):
            ww = w if maximum else np.where(np.isneginf(w), np.inf, w)
            compact = int(rng.choice([1, 1 << 30]))  # drop inner edges as it goes, or not
            owner = N(edge_forest(T(u, device), T(v, device), T(ww, device, torch.float32), n, maximum=maximum,
                                  size=max(sizes), compact_above=compact))
            assert owner.shape == (n,) and owner.dtype == np.int64
            got = forest_pairs(u, v, owner)
            assert len(set(got)) == len(got)  # every forest edge owned once
            ref = kruskal_edges(u, v, ww, n, maximum)
            assert set(got) == ref
            assert ref == networkx_edges(u, v, ww, n, maximum)


@pytest.mark.parametrize("m", SIZES)
def test_edge_forest_equals_the_dense_kernel_on_complete_graphs(device, m):
    """The upper triangle of a (B, m, m) matrix as an edge list: the same forest as
    :func:`spanning_forest`, with the slots of each tree offset by its row."""
    rng = np.random.default_rng(m)
    B = 3
    A = np.round(rng.uniform(-1, 1, (B, m, m)) * 4) / 4
    W = np.triu(A, 1) + np.triu(A, 1).transpose(0, 2, 1)
    act = rng.random((B, m)) < 0.8
    du, dv, _, ok = (N(x) for x in spanning_forest(T(W, device, torch.float32), T(act, device)))
    iu, ju = np.triu_indices(m, 1)
    u = (np.arange(B)[:, None] * m + iu[None]).reshape(-1)
    v = (np.arange(B)[:, None] * m + ju[None]).reshape(-1)
    w = np.where(act[:, iu] & act[:, ju], W[:, iu, ju], -np.inf).reshape(-1)
    owner = N(edge_forest(T(u, device), T(v, device), T(w, device, torch.float32), B * m, size=m, compact_above=8))
    want = {(b * m + int(a), b * m + int(c)) for b in range(B) for a, c, o in zip(du[b], dv[b], ok[b]) if o}
    assert set(forest_pairs(u, v, owner)) == want


def test_edge_forest_empty_and_trivial(device):
    z = torch.zeros(0, dtype=torch.int64, device=device)
    assert N(edge_forest(z, z, torch.zeros(0, device=device), 5)).tolist() == [-1] * 5
    assert edge_forest(z, z, torch.zeros(0, device=device), 0).shape == (0,)
    u, v = T([0, 1, 2], device), T([0, 0, 1], device)  # a self loop, then a path
    owner = N(edge_forest(u, v, T([9.0, 1.0, float("nan")], device), 3))
    assert forest_pairs(N(u), N(v), owner) == [(0, 1)]


def test_order_key_and_top_by_key(device):
    rng = np.random.default_rng(0)
    w = np.round(rng.uniform(-2, 2, (4, 7, 30)) * 2) / 2  # many ties, negative and positive
    w[0, 0, :] = -np.inf
    w[1, 1, 5:] = -np.inf
    w[2, 2, 3] = 0.0
    w[2, 2, 4] = -0.0
    col = np.tile(rng.permutation(30), (4, 7, 1))
    wt, ct = T(w, device, torch.float32), T(col, device)
    keys = N(order_key(wt, ct))
    for k in (1, 5, 30, 40):
        cols, ww, j = (N(x) for x in top_by_key(wt, ct, k))
        for a in range(4):
            for b in range(7):
                ref = sorted((c for c in range(30) if np.isfinite(w[a, b, c])),
                             key=lambda c: (-w[a, b, c], col[a, b, c]))
                ref = [int(col[a, b, c]) for c in ref[:k]]
                assert cols[a, b].tolist() == ref + [-1] * (k - len(ref))
                assert (cols[a, b] == np.where(j[a, b] < 30, col[a, b][j[a, b]], -1)).sum() >= len(ref)
        flat = keys.reshape(-1, 30)
        assert all(len(set(r.tolist())) == 30 for r in flat)  # keys never tie


def dyadic(rng, B, m, D=4):
    """Vectors with entries in {0, +-1/2}: every dot product is exact in float32, so equal
    scores are exact ties."""
    return rng.choice([-0.5, 0.0, 0.5], size=(B, m, D)).astype(np.float32)


def brute_scores(X, val, i, scale, bias):
    return {j: scale * float(X[i] @ X[j]) + bias[j] for j in range(len(X)) if j != i and val[j]}


@pytest.mark.parametrize("m", SIZES)
def test_knn_blockwise_returns_the_best_scores(device, m):
    """Exactly the c best scores (as a multiset: which of tied columns is unspecified),
    distinct valid columns, never the point itself."""
    rng = np.random.default_rng(m + 7)
    B, c = 3, 5
    X = dyadic(rng, B, m)
    val = rng.random((B, m)) < 0.8
    bias = np.round(rng.uniform(-1, 1, (B, m)) * 4) / 4
    for scale, bb in ((1.0, None), (0.5, bias)):
        got = N(knn_blockwise(T(X, device), T(val, device), c, scale=scale,
                              bias=None if bb is None else T(bb, device, torch.float32), tile_elements=64))
        assert got.shape == (B, m, c)
        for b in range(B):
            bvec = np.zeros(m) if bb is None else bb[b]
            for i in range(m):
                row = got[b, i]
                if not val[b, i]:
                    assert (row == -1).all()
                    continue
                sc = brute_scores(X[b], val[b], i, scale, bvec)
                want = sorted(sc.values(), reverse=True)[:c]
                cols = [int(j) for j in row if j >= 0]
                assert len(cols) == len(want) and len(set(cols)) == len(cols)
                assert i not in cols and all(val[b, j] for j in cols)
                assert sorted((sc[j] for j in cols), reverse=True) == want


@pytest.mark.parametrize("m", [1, 2, 7, 100, 257, 1000])
def test_balanced_cells_partition(device, m):
    rng = np.random.default_rng(m)
    X = rng.standard_normal((2, m, 8)).astype(np.float32)
    val = rng.random((2, m)) < 0.9
    for levels in (0, 1, 3):
        mem = N(balanced_cells(T(X, device), T(val, device), levels))
        assert mem.shape[1] == 2 ** levels
        for b in range(2):
            got = mem[b][mem[b] >= 0]
            assert sorted(got.tolist()) == np.flatnonzero(val[b]).tolist()  # each valid point once
            sizes = (mem[b] >= 0).sum(1)
            assert sizes.max() - sizes.min() <= 1


def test_knn_cells(device):
    """One cell searched (probe covers all): the exact scores; clustered data with a real
    cut: most of the exact neighbours found."""
    rng = np.random.default_rng(3)
    X = dyadic(rng, 2, 60, D=6)
    val = np.ones((2, 60), dtype=bool)
    got = N(knn_cells(T(X, device), T(val, device), 4, cell=16, probe=8))
    for b in range(2):
        for i in range(60):
            sc = brute_scores(X[b], val[b], i, 1.0, np.zeros(60))
            assert sorted((sc[j] for j in got[b, i]), reverse=True) == sorted(sc.values(), reverse=True)[:4]
    centres = rng.standard_normal((40, 32))
    Y = centres[rng.integers(0, 40, 4000)] + 0.3 * rng.standard_normal((4000, 32))
    Y = (Y / np.linalg.norm(Y, axis=1, keepdims=True)).astype(np.float32)[None]
    v1 = np.ones((1, 4000), dtype=bool)
    exact = N(knn_blockwise(T(Y, device), T(v1, device), 8))[0]
    approx = N(knn_cells(T(Y, device), T(v1, device), 8, cell=256, probe=4))[0]
    S = Y[0] @ Y[0].T
    np.fill_diagonal(S, -np.inf)
    kth = np.sort(S, 1)[:, -8]
    found = np.take_along_axis(S, np.maximum(approx, 0), 1) >= kth[:, None] - 1e-6
    assert (approx >= 0).all() and found.mean() > 0.8, found.mean()
    assert (exact >= 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_float_order_key_sorts_as_the_floats(dtype):
    """sort_edges sorts weights by an integer key (a radix sort on a CPU): its stable sort is the
    floats' stable sort, ascending and descending, with ties (-0.0 and 0.0 among them), infinities,
    subnormals and repeated values."""
    from memforest_gpu.kernels.edge_mst import float_order_key

    g = torch.Generator().manual_seed(9)
    w = torch.randn(5000, generator=g, dtype=torch.float64).to(dtype)
    w[:200] = w[200:400]  # repeats
    tiny = torch.finfo(dtype).tiny
    w[400:410] = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), tiny / 4, -tiny / 4, tiny, -tiny, 1.0, -1.0],
                              dtype=dtype)
    w[410:420] = -0.0
    w = w[torch.randperm(5000, generator=g)]
    for desc in (False, True):
        want = torch.argsort(w, descending=desc, stable=True)
        assert torch.equal(torch.argsort(float_order_key(w, descending=desc), stable=True), want)
