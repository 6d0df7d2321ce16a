"""Kernel tests: best_match, k-means seeding / Lloyd / centres, reassignment.

Each kernel is checked against an independent, deliberately simple reference; how the
references and the tie-exact inputs are built is in tests/kernel_helpers.py.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from kernel_helpers import SIZES, N, T, _one_cpu_thread  # noqa: F401 (autouse fixture)

from memforest_gpu.kernels.assign import best_match, best_score
from memforest_gpu.kernels.lloyd import cluster_centres, kmeans, lloyd_step
from memforest_gpu.kernels.reassign import reassign_to_centres
from memforest_gpu.kernels.seeding import kmeans_plus_plus

# ----------------------------------------------------------------------------------------------
# 3. best_match
# ----------------------------------------------------------------------------------------------

def best_match_ref(X, C, c_valid, mode):
    """numpy brute force: argmin squared distance ("l2") / argmax dot ("dot"), first index on ties."""
    Tn, n, _ = X.shape
    idx = np.full((Tn, n), -1, dtype=np.int64)
    score = np.full((Tn, n), -np.inf)
    for t in range(Tn):
        for i in range(n):
            best, bj = None, -1
            for j in range(C.shape[1]):
                if not c_valid[t, j]:
                    continue
                if mode == "l2":
                    val = -float(((X[t, i] - C[t, j]) ** 2).sum())
                else:
                    val = float(X[t, i] @ C[t, j])
                if best is None or val > best:
                    best, bj = val, j
            if bj >= 0:
                idx[t, i] = bj
                c = C[t, bj]
                score[t, i] = 2 * X[t, i] @ c - c @ c if mode == "l2" else X[t, i] @ c
    return score, idx


BM_SHAPES = [(1, 1, 1, 1), (1, 2, 1, 3), (2, 3, 2, 2), (3, 7, 5, 4), (2, 31, 13, 3), (4, 100, 9, 8), (2, 5, 40, 2)]


@pytest.mark.parametrize("mode", ["l2", "dot"])
@pytest.mark.parametrize("shape", BM_SHAPES)
def test_best_match_exact_ties_and_tiling(device, shape, mode):
    Tn, n, K, D = shape
    rng = np.random.default_rng(Tn * 100 + n + K + D)
    X = rng.integers(-3, 4, (Tn, n, D)).astype(np.float64)  # small integers: every score is exact
    C = rng.integers(-3, 4, (Tn, K, D)).astype(np.float64)
    if K > 1:
        C[:, -1] = C[:, 0]  # duplicated centres tie exactly
    if K > 2 and n > 1:
        X[:, 1] = C[:, 2]  # a point sitting on a centre
    cv = rng.random((Tn, K)) < 0.7
    cv[0] = True
    if Tn > 1:
        cv[-1] = False  # a problem with no valid centre
    s_ref, i_ref = best_match_ref(X, C, cv, mode)
    Xt, Ct, cvt = T(X, device, torch.float32), T(C, device, torch.float32), T(cv, device)
    # one tile, one row per tile (small problems), a few rows per tile
    budgets = (1 << 24, Tn * K * 8) + ((1,) if n <= 7 else ())
    for tile_elements in budgets:
        s, i = best_match(Xt, Ct, cvt, mode=mode, tile_elements=tile_elements)
        assert i.dtype == torch.int64 and s.shape == i.shape == (Tn, n)
        np.testing.assert_array_equal(N(i), i_ref)
        np.testing.assert_array_equal(N(s).astype(np.float64), s_ref)


@pytest.mark.parametrize("mode", ["l2", "dot"])
def test_best_match_continuous(device, mode):
    rng = np.random.default_rng(7)
    Tn, n, K, D = 3, 100, 11, 16
    X = rng.standard_normal((Tn, n, D))
    C = rng.standard_normal((Tn, K, D))
    cv = rng.random((Tn, K)) < 0.6
    cv[:, 3] = True
    Xt, Ct = T(X, device, torch.float32), T(C, device, torch.float32)
    X, C = N(Xt).astype(np.float64), N(Ct).astype(np.float64)
    if mode == "l2":
        val = -((X[:, :, None] - C[:, None]) ** 2).sum(-1)
    else:
        val = X @ C.transpose(0, 2, 1)
    val[~np.broadcast_to(cv[:, None, :], val.shape)] = -np.inf
    best = val.max(-1)
    for tile_elements in (1 << 24, Tn * K * 30):  # one tile, four tiles
        s, i = best_match(Xt, Ct, T(cv, device), mode=mode, tile_elements=tile_elements)
        i = N(i)
        assert cv[np.arange(Tn)[:, None], i].all()
        got = np.take_along_axis(val, i[:, :, None], -1)[..., 0]
        assert np.all(got >= best - 1e-4)  # float32 rounding only


def test_best_match_duplicate_centres_continuous(device):
    g = torch.Generator().manual_seed(0)
    for D, K, n in [(384, 2, 1), (384, 5, 7), (100, 5, 7), (100, 17, 7)]:
        for mode in ("dot", "l2"):
            for tile_elements in (1 << 24, 1):
                C = torch.nn.functional.normalize(torch.randn(2, K, D, generator=g), dim=-1)
                C[:, K - 1] = C[:, 0]  # centre K-1 duplicates centre 0
                X = torch.nn.functional.normalize(torch.randn(2, n, D, generator=g), dim=-1)
                X[:, 0] = C[:, 0]
                _, i = best_match(X.to(device), C.to(device), torch.ones(2, K, dtype=torch.bool, device=device),
                                  mode=mode, tile_elements=tile_elements)
                assert not bool((i == K - 1).any()), (D, K, n, mode, tile_elements)  # 0 ties with K-1 and comes first


@pytest.mark.parametrize("mode", ["l2", "dot"])
def test_best_score_is_best_matchs_score_bit_for_bit(device, mode):
    """The score alone (the seeding and the settled rows' bound use it) is the score that
    best_match gives, the same bits, in one tile or many, with invalid centres, a problem
    without any and no centre at all."""
    g = torch.Generator().manual_seed(3)
    X = torch.randn(3, 57, 24, generator=g).to(device)
    C = torch.randn(3, 9, 24, generator=g).to(device)
    C[:, 8] = C[:, 0]
    cv = (torch.rand(3, 9, generator=g) < 0.6).to(device)
    cv[0] = True
    cv[2] = False
    for tile_elements in (1 << 24, 3 * 9 * 5, 1):
        for backend in ("torch", "auto"):
            s = best_score(X, C, cv, mode=mode, tile_elements=tile_elements, backend=backend)
            assert torch.equal(s, best_match(X, C, cv, mode=mode, tile_elements=tile_elements, backend=backend)[0])
        assert bool(torch.isinf(s[2]).all())
    assert bool(torch.isinf(best_score(X, C[:, :0], cv[:, :0], mode=mode)).all())
    with pytest.raises(ValueError, match="backend"):
        best_score(X, C, cv, backend="cuda")
    with pytest.raises(ValueError, match="mode"):
        best_score(X, C, cv, mode="cos")


def test_best_match_rejects_bad_input(device):
    X = torch.zeros(1, 2, 3, device=device)
    with pytest.raises(ValueError):
        best_match(X, X, torch.ones(1, 2, dtype=torch.bool, device=device), mode="cos")
    with pytest.raises(ValueError):
        best_match(X, torch.zeros(1, 2, 4, device=device), torch.ones(1, 2, dtype=torch.bool, device=device))


# ----------------------------------------------------------------------------------------------
# 4. k-means: lloyd_step, kmeans_plus_plus, kmeans, cluster_centres
# ----------------------------------------------------------------------------------------------

def padded(rng, sizes, D, make, garbage=37.0):
    """Stack problems of different sizes into (T, n, D) + (T, n) prefix-valid mask; padding rows
    hold a large garbage value so a kernel reading them would go wrong."""
    n = max(sizes)
    X = np.full((len(sizes), n, D), garbage)
    valid = np.zeros((len(sizes), n), dtype=bool)
    for t, s in enumerate(sizes):
        X[t, :s] = make(s)
        valid[t, :s] = True
    return X, valid


@pytest.mark.parametrize("n", SIZES)
def test_lloyd_step_exact(device, n):
    rng = np.random.default_rng(n)
    sizes = [n, max(1, n // 2), 1]
    X, valid = padded(rng, sizes, 3, lambda s: rng.integers(-2, 3, (s, 3)))
    K = 6
    C = rng.integers(-2, 3, (3, K, 3)).astype(np.float64)
    C[:, 4] = C[:, 1]  # duplicate centroid: the lower index must win
    cv = np.ones((3, K), dtype=bool)
    cv[1, [0, 2]] = False
    _, ref = best_match_ref(X, C, cv, "l2")
    ref[~valid] = -1
    for tile_elements in (1 << 24, 3 * K * 8) + ((1,) if n <= 7 else ()):
        lab, score = lloyd_step(T(X, device, torch.float32), T(valid, device), T(C, device, torch.float32),
                                T(cv, device), tile_elements=tile_elements)
        np.testing.assert_array_equal(N(lab), ref)


def kpp_ref(X: np.ndarray, size: int, k: int, u: np.ndarray) -> list:
    """k-means++ by inverse-CDF sampling of D^2 with the given uniforms (exact for integer X)."""
    X = X[:size]
    seeds = [min(int(u[0] * size), size - 1)]
    d2 = ((X - X[seeds[0]]) ** 2).sum(1)
    for s in range(1, k):
        w = d2.copy()
        w[seeds] = 0
        total = w.sum()
        if total > 0:
            pick = int(np.searchsorted(np.cumsum(w), u[s] * total, side="right"))
        else:  # every remaining point coincides with a centre: first unchosen point
            pick = next(i for i in range(size) if i not in seeds)
        seeds.append(pick)
        d2 = np.minimum(d2, ((X - X[pick]) ** 2).sum(1))
    return seeds


def test_kmeans_plus_plus_exact(device):
    rng = np.random.default_rng(5)
    sizes = [100, 31, 7, 3, 2, 1, 6]
    ks = [10, 6, 7, 2, 2, 1, 4]  # k == n for two problems; the last problem is all duplicates
    D = 2
    X, valid = padded(rng, sizes, D, lambda s: rng.integers(-2, 3, (s, D)))
    X[6, :6] = 1.0
    X[3, :3] = [[0, 0], [0, 0], [1, 1]]
    Kmax = max(ks)
    U = rng.random((Kmax, len(sizes)))
    args = (T(X, device, torch.float32), T(valid, device), T(ks, device))
    seeds = N(kmeans_plus_plus(*args, uniforms=T(U, device)))
    assert seeds.shape == (len(sizes), Kmax)
    for t, (s, k) in enumerate(zip(sizes, ks)):
        ref = kpp_ref(X[t], s, k, U[:, t])
        assert seeds[t, :k].tolist() == ref
        assert (seeds[t, k:] == -1).all()
        assert len(set(ref)) == k  # distinct points even among duplicates
    # the seed draws from a CPU generator: same seed -> same seeds, on every device
    a = N(kmeans_plus_plus(*args, seed=11))
    b = N(kmeans_plus_plus(*args, seed=11))
    c = N(kmeans_plus_plus(torch.as_tensor(X, dtype=torch.float32), torch.as_tensor(valid), torch.as_tensor(ks),
                           seed=11))
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)


def lloyd_ref(X: np.ndarray, seeds, max_iter: int = 30):
    """Plain Lloyd from the given seed points; empty cluster -> farthest point from its centroid."""
    C = X[list(seeds)].astype(np.float64).copy()
    K = len(seeds)
    prev = None
    for _ in range(max_iter):
        d = ((X[:, None] - C[None]) ** 2).sum(-1)
        lab = d.argmin(1)
        if prev is not None and (lab == prev).all():
            break
        prev = lab
        dist = d[np.arange(len(X)), lab]
        far = list(np.argsort(-dist, kind="stable"))
        for c in range(K):
            mem = lab == c
            C[c] = X[mem].mean(0) if mem.any() else X[far.pop(0)]
    means = np.stack([X[lab == c].mean(0) if (lab == c).any() else C[c] for c in range(K)])
    return lab, float(((X - means[lab]) ** 2).sum())


def blobs(rng, s, D, k):
    centres = rng.standard_normal((k, D)) * 3
    pts = centres[rng.integers(0, k, s)] + rng.standard_normal((s, D))
    if s > 4:
        pts[-2:] = pts[:2]  # duplicated points
    return pts / np.linalg.norm(pts, axis=1, keepdims=True)


def test_kmeans_batched_vs_numpy_lloyd(device):
    rng = np.random.default_rng(3)
    sizes, ks, D = [100, 31, 7], [6, 3, 2], 4
    X, valid = padded(rng, sizes, D, lambda s: blobs(rng, s, D, 4))
    Kmax = max(ks)
    U = rng.random((Kmax, 3))
    Xt, vt, kt, Ut = T(X, device, torch.float32), T(valid, device), T(ks, device), T(U, device)
    labels, means, c_valid, it = kmeans(Xt, vt, kt, seeding="k-means++", uniforms=Ut,
                                        tile_elements=3 * Kmax * 16)  # 7 tiles
    assert 1 <= it <= 30
    lab, cv, mu = N(labels), N(c_valid), N(means).astype(np.float64)
    seeds = N(kmeans_plus_plus(Xt, vt, kt, uniforms=Ut))
    Xf = N(Xt).astype(np.float64)
    for t, (s, k) in enumerate(zip(sizes, ks)):
        assert (lab[t, s:] == -1).all()
        assert ((lab[t, :s] >= 0) & (lab[t, :s] < k)).all()
        assert cv[t, lab[t, :s]].all()  # only among the problem's valid clusters
        assert not cv[t, k:].any()
        for c in range(k):
            mem = lab[t, :s] == c
            assert cv[t, c] == mem.any()
            if mem.any():
                np.testing.assert_allclose(mu[t, c], Xf[t, :s][mem].mean(0), atol=1e-5)
        obj = float(((Xf[t, :s] - mu[t, lab[t, :s]]) ** 2).sum())
        _, ref_obj = lloyd_ref(Xf[t, :s], seeds[t, :k])
        assert abs(obj - ref_obj) <= 0.10 * ref_obj + 1e-6, (t, obj, ref_obj)
    # deterministic: same uniforms, same seed -> same result
    l2, m2, c2, _ = kmeans(Xt, vt, kt, seeding="k-means++", uniforms=Ut, tile_elements=1 << 24)
    assert torch.equal(labels, l2) and torch.equal(c_valid, c2)
    a = kmeans(Xt, vt, kt, seed=4)
    b = kmeans(Xt, vt, kt, seed=4)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    # per-problem uniform streams: a problem alone gives the batched result
    for t, (s, k) in enumerate(zip(sizes, ks)):
        alone = kmeans(Xt[t:t + 1, :s], vt[t:t + 1, :s], kt[t:t + 1], seeding="k-means++", uniforms=Ut[:k, t:t + 1])[0]
        np.testing.assert_array_equal(N(alone)[0], lab[t, :s])


def test_kmeans_degenerate_duplicates(device):
    # every point identical: k-means++ falls back to distinct (equal) points, one cluster keeps
    # everything, the others end empty and are reported invalid
    X = np.tile(np.array([[0.6, 0.8, 0.0]]), (5, 1))[None]
    X = np.concatenate([X, np.concatenate([np.eye(3), np.full((2, 3), 37.0)])[None]])
    valid = np.array([[True] * 5, [True] * 3 + [False] * 2])
    labels, means, c_valid, _ = kmeans(T(X, device, torch.float32), T(valid, device), T([3, 3], device), seed=0)
    assert N(labels)[0].tolist() == [0] * 5 and N(c_valid)[0].tolist() == [True, False, False]
    assert sorted(N(labels)[1, :3].tolist()) == [0, 1, 2] and N(labels)[1, 3:].tolist() == [-1, -1]
    assert N(c_valid)[1].all()


def test_kmeans_one_iteration_is_lloyd_from_seeds(device):
    rng = np.random.default_rng(9)
    X, valid = padded(rng, [31, 7], 3, lambda s: rng.integers(-2, 3, (s, 3)))
    ks = [5, 3]
    U = rng.random((5, 2))
    Xt, vt, kt = T(X, device, torch.float32), T(valid, device), T(ks, device)
    labels = N(kmeans(Xt, vt, kt, seeding="k-means++", uniforms=T(U, device), max_iter=1)[0])
    seeds = N(kmeans_plus_plus(Xt, vt, kt, uniforms=T(U, device)))
    for t, k in enumerate(ks):
        s = int(valid[t].sum())
        C = X[t][seeds[t, :k]]
        ref = ((X[t, :s, None] - C[None]) ** 2).sum(-1).argmin(1)
        np.testing.assert_array_equal(labels[t, :s], ref)


def centres_ref(X, valid, labels, means, c_valid):
    Tn, n, _ = X.shape
    K = means.shape[1]
    out = np.full((Tn, K), -1, dtype=np.int64)
    for t in range(Tn):
        for c in range(K):
            if not c_valid[t, c]:
                continue
            best, bj = None, -1
            for j in range(n):
                if valid[t, j] and labels[t, j] == c:
                    d = float(((X[t, j] - means[t, c]) ** 2).sum())
                    if best is None or d < best:
                        best, bj = d, j
            out[t, c] = bj
    return out


@pytest.mark.parametrize("n", SIZES)
def test_cluster_centres_exact(device, n):
    rng = np.random.default_rng(n + 50)
    sizes = [n, max(1, (2 * n) // 3)]
    X, valid = padded(rng, sizes, 2, lambda s: rng.integers(-2, 3, (s, 2)))  # many equal distances
    K = 5
    labels = np.where(valid, rng.integers(0, K - 1, valid.shape), -1)  # cluster K-1 stays empty
    means = rng.integers(-2, 3, (2, K, 2)).astype(np.float64)  # integer "means": exact distances
    cv = np.ones((2, K), dtype=bool)
    cv[1, 0] = False  # invalid cluster -> -1 even if it has members
    ref = centres_ref(X, valid, labels, means, cv)
    got = cluster_centres(T(X, device, torch.float32), T(valid, device), T(labels, device),
                          T(means, device, torch.float32), T(cv, device))
    np.testing.assert_array_equal(N(got), ref)
    assert (ref[:, K - 1] == -1).all() and ref[1, 0] == -1


def test_cluster_centres_of_kmeans(device):
    rng = np.random.default_rng(21)
    sizes, ks = [100, 31, 7], [6, 3, 2]
    X, valid = padded(rng, sizes, 4, lambda s: blobs(rng, s, 4, 3))
    Xt, vt = T(X, device, torch.float32), T(valid, device)
    labels, means, c_valid, _ = kmeans(Xt, vt, T(ks, device), seed=1)
    centre = N(cluster_centres(Xt, vt, labels, means, c_valid))
    lab, mu, cv = N(labels), N(means).astype(np.float64), N(c_valid)
    Xf = N(Xt).astype(np.float64)
    for t, s in enumerate(sizes):
        for c in range(means.shape[1]):
            mem = np.nonzero(lab[t, :s] == c)[0]
            if not cv[t, c]:
                assert centre[t, c] == -1
                continue
            d = ((Xf[t, mem] - mu[t, c]) ** 2).sum(1)
            assert centre[t, c] in mem
            assert ((Xf[t, centre[t, c]] - mu[t, c]) ** 2).sum() <= d.min() + 1e-5
            if s > 4 and c == lab[t, 0] == lab[t, s - 2]:  # rows 0 and s-2 are equal: lowest index wins
                assert centre[t, c] != s - 2


# ----------------------------------------------------------------------------------------------
# 5. reassign_to_centres
# ----------------------------------------------------------------------------------------------

def quarter_units(rng, shape, D=8):
    """Unit vectors with four entries of +-1/2: every cosine is a multiple of 1/4, exactly."""
    X = np.zeros(shape + (D,), dtype=np.float32)
    pick = np.argsort(rng.random(shape + (D,)), axis=-1)[..., :4]
    np.put_along_axis(X, pick, rng.choice([-0.5, 0.5], shape + (4,)).astype(np.float32), axis=-1)
    return X


def reassign_problem(rng, sizes, Kmax, make):
    """Padded batch with labels consistent with the centres: every valid cluster has its centre
    as a member, some cluster ids in the middle are unused (centre -1, no members)."""
    Tn, n = len(sizes), max(sizes)
    X = np.zeros((Tn, n, make.D), dtype=np.float32)
    valid = np.zeros((Tn, n), dtype=bool)
    labels = np.full((Tn, n), -1, dtype=np.int64)
    centre = np.full((Tn, Kmax), -1, dtype=np.int64)
    for t, s in enumerate(sizes):
        X[t] = make(n)  # padding rows hold real-looking vectors too
        valid[t, :s] = True
        k = int(rng.integers(1, min(s, Kmax) + 1))
        ids = np.sort(rng.choice(Kmax, k, replace=False))
        pos = rng.choice(s, k, replace=False)
        labels[t, :s] = rng.choice(ids, s)
        centre[t, ids] = pos
        labels[t, pos] = ids
        if s > 3:
            X[t, s - 1] = X[t, pos[0]]  # a duplicate of a centre
    return X, valid, labels, centre


def reassign_ref(X, valid, labels, centre, beta, window, use_semantic, use_temporal):
    """Brute force: the full (n, K) matrix u = beta*cos + (1-beta)*[|pos_j - pos_c| <= window]
    (in float32, the kernels' precision), k-means label kept when u_own >= max - 1e-6, else the
    lowest cluster id among the max; centres stay in their own cluster."""
    sem = np.float32(beta if use_semantic else 0.0)
    tmp = np.float32((1.0 - beta) if use_temporal else 0.0)
    Tn, n, _ = X.shape
    out = np.full((Tn, n), -1, dtype=np.int64)
    for t in range(Tn):
        cids = [c for c in range(centre.shape[1]) if centre[t, c] >= 0]
        cpos = np.array([centre[t, c] for c in cids])
        for j in range(n):
            if not valid[t, j]:
                continue
            if j in cpos:
                out[t, j] = cids[list(cpos).index(j)]
                continue
            cos = (X[t, j][None, :] * X[t, cpos]).sum(-1, dtype=np.float32)
            ind = (np.abs(j - cpos) <= window).astype(np.float32)
            u = sem * cos + tmp * ind  # (K_valid,) float32
            mx = u.max()
            own = u[cids.index(labels[t, j])]
            out[t, j] = labels[t, j] if own >= mx - np.float32(1e-6) else cids[int(np.nonzero(u == mx)[0][0])]
    return out


class _Quarter:
    D = 8

    def __init__(self, rng):
        self.rng = rng

    def __call__(self, n):
        return quarter_units(self.rng, (n,))


REASSIGN_CASES = [  # beta, window, use_semantic, use_temporal
    (0.8, 5, True, True), (0.8, 2, True, True), (0.8, 0, True, True),
    (1.0, 5, True, True), (1.0, 0, True, True),
    (0.0, 5, True, True), (0.0, 2, True, True),
    (0.8, 2, False, True), (0.8, 5, True, False), (0.8, 2, False, False),
]


@pytest.mark.parametrize("case", REASSIGN_CASES)
@pytest.mark.parametrize("n", SIZES)
def test_reassign_exact(device, n, case):
    beta, window, sem, tmp = case
    rng = np.random.default_rng(n * 31 + window)
    sizes = [n] + [int(rng.integers(1, n + 1)) for _ in range(3)]
    X, valid, labels, centre = reassign_problem(rng, sizes, min(n, 7) + 2, _Quarter(rng))
    ref = reassign_ref(X, valid, labels, centre, beta, window, sem, tmp)
    for tile_elements in (1 << 24, len(sizes) * centre.shape[1] * 8)[: 1 if n < 8 else 2]:  # one tile, 8 rows/tile
        got = reassign_to_centres(T(X, device), T(valid, device), T(labels, device), T(centre, device),
                                  beta=beta, window=window, use_semantic=sem, use_temporal=tmp,
                                  tile_elements=tile_elements)
        np.testing.assert_array_equal(N(got), ref)
    if not sem and not tmp:  # nothing scores: everyone keeps the k-means label
        np.testing.assert_array_equal(ref, labels)


def test_reassign_continuous(device):
    rng = np.random.default_rng(17)

    class G:
        D = 16

        def __call__(self, n):
            x = rng.standard_normal((n, 16)).astype(np.float32)
            return x / np.linalg.norm(x, axis=1, keepdims=True)

    sizes = [100, 57, 31]
    X, valid, labels, centre = reassign_problem(rng, sizes, 9, G())
    beta, window = 0.8, 5
    got = N(reassign_to_centres(T(X, device), T(valid, device), T(labels, device), T(centre, device),
                                beta=beta, window=window))
    Xd = X.astype(np.float64)
    for t, s in enumerate(sizes):
        cids = [c for c in range(centre.shape[1]) if centre[t, c] >= 0]
        cpos = centre[t, cids]
        for j in range(s):
            if j in cpos:
                assert got[t, j] == cids[list(cpos).index(j)]
                continue
            u = beta * Xd[t, cpos] @ Xd[t, j] + (1 - beta) * (np.abs(j - cpos) <= window)
            own = u[cids.index(labels[t, j])]
            tol = 1e-5  # float32 versus float64 scores
            if own >= u.max() - 1e-6 + tol:
                assert got[t, j] == labels[t, j]
            elif own < u.max() - 1e-6 - tol:
                assert got[t, j] != labels[t, j] and u[cids.index(got[t, j])] >= u.max() - tol
        assert (got[t, s:] == -1).all()


@pytest.mark.parametrize("beta,use_temporal", [(1.0, True), (0.8, False)])
def test_reassign_duplicate_centres_tie(device, beta, use_temporal):
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        X = torch.nn.functional.normalize(torch.randn(1, 4, 384, generator=g), dim=-1)
        X[0, 3] = X[0, 1]  # cluster 0's centre (column 3) duplicates cluster 1's centre (column 1)
        if float(X[0, 0] @ X[0, 1]) <= float(X[0, 0] @ X[0, 2]):
            continue
        out = reassign_to_centres(X.to(device), torch.ones(1, 4, dtype=torch.bool, device=device),
                                  T([[2, 1, 2, 0]], device), T([[3, 1, 2]], device), beta=beta, window=1,
                                  use_temporal=use_temporal)
        assert int(out[0, 0]) == 0  # clusters 0 and 1 tie for point 0 (label 2 scores lower): lowest id


# --------------------------------------------------------------------------- batched D^2 seeding
def test_counter_uniform_is_a_pure_function_of_its_keys():
    from memforest_gpu.kernels.rand import counter_uniform, stream_keys

    s = stream_keys([3, 7, 11])
    u = counter_uniform(5, s, 2, 1000)
    assert u.dtype == torch.float64 and u.shape == (3, 1000)
    assert bool(((u > 0) & (u < 1)).all())
    assert torch.equal(u[1:2], counter_uniform(5, s[1:2], 2, 1000))  # a stream never depends on its batch
    assert torch.equal(u[:, :10], counter_uniform(5, s, 2, 10))  # nor on how many positions are drawn
    assert not torch.equal(u, counter_uniform(6, s, 2, 1000)) and not torch.equal(u, counter_uniform(5, s, 3, 1000))
    assert abs(float(u.mean()) - 0.5) < 0.02


def padded_problems(rng, sizes: list[int], dim: int):
    """Gaussian points of len(sizes) problems padded to the largest. Shape: -> X (T, n, dim), valid (T, n)"""
    X = np.zeros((len(sizes), max(sizes), dim), dtype=np.float32)
    valid = np.zeros((len(sizes), max(sizes)), dtype=bool)
    for t, n in enumerate(sizes):
        X[t, :n] = rng.standard_normal((n, dim))
        valid[t, :n] = True
    return X, valid


def check_seeds(seeding, Xt, vt, kt, streams, sizes) -> np.ndarray:
    """``seeding(X, valid, k, streams)`` gives each problem k distinct valid points, -1 after them,
    and the same seeds to a problem alone (nothing depends on its batch-mates). Returns the seeds."""
    seeds = N(seeding(Xt, vt, kt, streams))
    for t, (n, k) in enumerate(zip(sizes, kt.tolist())):
        s = seeds[t, :k]
        assert (s >= 0).all() and (s < n).all() and len(set(s.tolist())) == k
        assert (seeds[t, k:] == -1).all()
        alone = N(seeding(Xt[t:t + 1, :n], vt[t:t + 1, :n], kt[t:t + 1], streams[t:t + 1]))
        assert (alone[0, :k] == s).all()
    return seeds


def test_batched_seeds_are_distinct_valid_and_batch_independent(device):
    from memforest_gpu.kernels.rand import stream_keys
    from memforest_gpu.kernels.seeding import batched_d2_seeds, seeding_steps

    sizes, ks = [50, 9, 33], [12, 9, 1]
    X, valid = padded_problems(np.random.default_rng(4), sizes, 6)
    X[1, :9] = X[1, 0]  # every point of problem 1 the same: d^2 = 0 after the first draw
    Xt, vt, kt = T(X, device, torch.float32), T(valid, device), T(ks, device)
    streams = stream_keys([10, 20, 30], device=Xt.device)
    seeds = check_seeds(lambda X, v, k, st: batched_d2_seeds(X, v, k, seed=1, streams=st), Xt, vt, kt, streams, sizes)
    assert seeds.shape == (3, 12)
    assert seeds[1, :9].tolist()[1:] == sorted(seeds[1, 1:9].tolist())  # duplicates: lowest index first
    assert sum(seeding_steps(1000)) == 1000 and len(seeding_steps(1000)) < 40


def test_batched_seeding_spreads_over_separated_clusters():
    """D^2 sampling finds well-separated blobs: 8 tight clusters, 8 seeds. Every stream hits
    at least 7 clusters and about half hit all 8 (a batch of two can land in one cluster;
    uniform seeding hits all 8 with probability 8!/8^8 = 0.2%)."""
    from memforest_gpu.kernels.seeding import batched_d2_seeds

    rng = np.random.default_rng(0)
    centres = rng.standard_normal((8, 16)) * 20
    X = torch.tensor(np.concatenate([c + rng.standard_normal((40, 16)) * 0.1 for c in centres]), dtype=torch.float32)
    T_ = 20
    seeds = batched_d2_seeds(X[None].expand(T_, -1, -1), torch.ones(T_, 320, dtype=torch.bool),
                             torch.full((T_,), 8), streams=torch.arange(T_))
    hit = [len(set((s // 40).tolist())) for s in seeds]
    assert min(hit) >= 7 and sum(h == 8 for h in hit) >= 8, hit


def test_parallel_seeds_are_distinct_valid_batch_independent_and_spread(device):
    """k-means|| (seeding="k-means||"): k distinct valid points per problem, the same seeds for a
    problem alone as in its batch (its stream key), and, like D^2 sampling, every one of 8
    separated blobs found by 8 seeds in most streams (the reduction weighs each candidate by
    the points nearest it, so a blob drawn twice in the rounds still gets one seed)."""
    from memforest_gpu.kernels.rand import stream_keys
    from memforest_gpu.kernels.seeding import parallel_seeds

    rng = np.random.default_rng(11)
    sizes, ks = [300, 120, 200], [20, 7, 1]
    X, valid = padded_problems(rng, sizes, 8)
    Xt, vt, kt = T(X, device, torch.float32), T(valid, device), T(ks, device)
    streams = stream_keys([1, 2, 3], device=Xt.device)
    seeds = check_seeds(lambda X, v, k, st: parallel_seeds(X, v, k, seed=4, streams=st, kmax=20), Xt, vt, kt,
                        streams, sizes)
    assert seeds.shape == (3, 20)
    centres = rng.standard_normal((8, 16)) * 20
    B = np.concatenate([c + rng.standard_normal((60, 16)) * 0.1 for c in centres]).astype(np.float32)
    T_ = 20
    Bt = T(np.broadcast_to(B, (T_,) + B.shape).copy(), device, torch.float32)
    ones = torch.ones(T_, 480, dtype=torch.bool, device=Bt.device)
    s = parallel_seeds(Bt, ones, torch.full((T_,), 8, device=Bt.device), streams=torch.arange(T_, device=Bt.device))
    hit = [len(set((r // 60).tolist())) for r in N(s)]
    assert min(hit) >= 7 and sum(h == 8 for h in hit) >= 15, hit
    with pytest.raises(ValueError, match="rounds"):
        parallel_seeds(Bt, ones, torch.full((T_,), 8, device=Bt.device), rounds=0)


def test_weighted_d2_seeds_draw_only_points_with_weight():
    """batched_d2_seeds with weights (k-means||'s reduction): a point of weight 0 is drawn only
    when no point with weight is left, and a heavy point is drawn first far more often."""
    from memforest_gpu.kernels.seeding import batched_d2_seeds

    g = torch.Generator().manual_seed(2)
    X = torch.randn(1, 40, 6, generator=g).expand(200, -1, -1)
    w = torch.zeros(200, 40, dtype=torch.float64)
    w[:, :10] = 1.0
    w[:, 3] = 50.0
    s = batched_d2_seeds(X, torch.ones(200, 40, dtype=torch.bool), torch.full((200,), 4), streams=torch.arange(200),
                         weights=w)
    assert bool((s < 10).all())
    assert int((s[:, 0] == 3).sum()) > 120  # 50 / 59 of the first draws, in expectation
