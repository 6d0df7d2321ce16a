"""Batched k-means (Euclidean, k-means++ seeding, Lloyd steps) over padded problems.

Each row of the batch is an independent problem (one tenant): its own points, its own
number of clusters. Assignment uses the tiled :func:`best_match`, so no (n, K) matrix
is ever held in full.
"""
from __future__ import annotations

import torch

from .assign import best_match

__all__ = ["kmeans", "kmeans_plus_plus", "kmeans_plus_plus_dense", "lloyd_step", "cluster_means", "cluster_centres"]


def _uniforms(seed: int, steps: int, T: int, device) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(int(seed))
    return torch.rand(steps, T, generator=g, dtype=torch.float64).to(device)  # (steps, T)


def _sample_step(d2, chosen, valid, sizes, u_s, active, rows):
    """One D^2-weighted draw per problem (see :func:`kmeans_plus_plus`). Shape: (T, n) -> (T,)"""
    w = d2.masked_fill(chosen, 0)
    total = w.sum(1, dtype=torch.float64)  # (T,)
    cdf = torch.cumsum(w, 1, dtype=torch.float64)  # (T, n)
    pick = torch.searchsorted(cdf, (u_s * total)[:, None], right=True)[:, 0]  # (T,)
    pick = torch.minimum(pick, (sizes - 1).clamp(min=0))
    empty = total <= 0
    if bool(empty.any()):  # degenerate: no mass left (duplicates) -> first valid, unchosen point
        pick = torch.where(empty, (valid & ~chosen).float().argmax(1), pick)
    # the cdf can land on a zero-weight point at the right edge; step back to one with mass
    bad = ~empty & (w[rows, pick] <= 0)
    if bool(bad.any()):
        pick = torch.where(bad, (w > 0).float().argmax(1), pick)
    return torch.where(active, pick, torch.full_like(pick, -1))


def kmeans_plus_plus(X: torch.Tensor, valid: torch.Tensor, k: torch.Tensor, *, seed: int = 0,
                     uniforms: torch.Tensor | None = None, dense_fraction: float = 0.35) -> torch.Tensor:
    """k-means++ seeding: first centre uniform, then D^2-weighted sampling.

    Random numbers come from a CPU generator seeded with ``seed`` so CPU and CUDA draw
    the same numbers; ``uniforms`` (Kmax, T) in [0, 1) overrides them (per-problem streams
    make a problem's result independent of what else is in the batch). When every
    remaining point coincides with a centre, the first valid point not yet chosen is taken.

    Each step only re-measures the points the new centre can win: a point whose
    nearest centre c_j satisfies |c_new - c_j| >= 2 d(x) cannot get closer (triangle
    inequality), so late steps touch a small fraction of the points. When more than
    ``dense_fraction`` of the points are candidates the step runs dense instead.
    Same seeds as :func:`kmeans_plus_plus_dense` up to float rounding.

    Shape: X (T, n, D), valid (T, n), k (T,) -> seeds (T, Kmax) int64 point indices (-1 = unused)
    """
    T, n, D = X.shape
    dev = X.device
    Kmax = int(k.max()) if T else 0
    seeds = torch.full((T, Kmax), -1, dtype=torch.int64, device=dev)
    if Kmax == 0:
        return seeds
    Xf = X.float()
    sizes = valid.sum(1)  # (T,)
    u = _uniforms(seed, Kmax, T, dev) if uniforms is None else uniforms.to(device=dev, dtype=torch.float64)
    rows = torch.arange(T, device=dev)
    first = torch.clamp((u[0] * sizes).long(), max=(sizes - 1).clamp(min=0))  # valid points are a prefix
    seeds[:, 0] = first
    sq = (Xf * Xf).sum(-1)  # (T, n)
    cent = torch.zeros(T, Kmax, D, dtype=torch.float32, device=dev)  # chosen centres so far
    cnorm = torch.zeros(T, Kmax, dtype=torch.float32, device=dev)  # their squared norms
    c = Xf[rows, first]  # (T, D)
    cent[:, 0] = c
    cnorm[:, 0] = (c * c).sum(-1)
    Xflat = Xf.reshape(T * n, D)
    d2 = (sq - 2 * torch.bmm(Xf, c[:, :, None])[:, :, 0] + (c * c).sum(-1)[:, None])
    d2 = d2.clamp(min=0).masked_fill(~valid, 0)  # (T, n) squared distance to the nearest centre
    near = torch.zeros(T, n, dtype=torch.int64, device=dev)  # which centre that is
    chosen = torch.zeros(T, n, dtype=torch.bool, device=dev)
    chosen[rows, first] = True
    d2[rows, first] = 0
    for s in range(1, Kmax):
        active = k > s  # (T,)
        pick = _sample_step(d2, chosen, valid, sizes, u[s], active, rows)
        seeds[:, s] = pick
        p = pick.clamp(min=0)
        ra = rows[active]
        chosen[ra, p[active]] = True
        c = Xf[rows, p]  # (T, D)
        cent[:, s] = c
        csq = (c * c).sum(-1)  # (T,)
        cnorm[:, s] = csq
        cc = cnorm[:, :s] - 2 * torch.bmm(cent[:, :s], c[:, :, None])[:, :, 0] + csq[:, None]  # (T, s)
        cand = valid & active[:, None] & (4.0 * d2 * (1 + 1e-5) + 1e-6 >= cc.gather(1, near))  # (T, n)
        n_cand = int(cand.sum())
        if n_cand > dense_fraction * int(valid[active].sum()):
            nd = (sq - 2 * torch.bmm(Xf, c[:, :, None])[:, :, 0] + csq[:, None]).clamp(min=0)
            win = cand & (nd < d2)
            d2 = torch.where(win, nd, d2)
            near = torch.where(win, torch.full_like(near, s), near)
        elif n_cand:
            ti, ni = cand.nonzero(as_tuple=True)
            flat = ti * n + ni
            nd = (sq.view(-1)[flat] - 2 * (Xflat.index_select(0, flat) * c[ti]).sum(-1) + csq[ti]).clamp(min=0)
            win = nd < d2[ti, ni]
            ti, ni = ti[win], ni[win]
            d2[ti, ni] = nd[win]
            near[ti, ni] = s
        d2[ra, p[active]] = 0
    return seeds


def kmeans_plus_plus_dense(X: torch.Tensor, valid: torch.Tensor, k: torch.Tensor, *, seed: int = 0,
                     uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """Reference k-means++: every step updates every point's distance (O(K n D) memory
    traffic). :func:`kmeans_plus_plus` computes the same seeds with pruning.

    Random numbers come from a CPU generator seeded with ``seed`` so CPU and CUDA draw
    the same numbers; ``uniforms`` (Kmax, T) in [0, 1) overrides them (per-problem streams
    make a problem's result independent of what else is in the batch). When every remaining point coincides with a centre, the first
    valid point not yet chosen is taken.

    Shape: X (T, n, D), valid (T, n), k (T,) -> seeds (T, Kmax) int64 point indices (-1 = unused)
    """
    T, n, _ = X.shape
    dev = X.device
    Kmax = int(k.max()) if T else 0
    seeds = torch.full((T, Kmax), -1, dtype=torch.int64, device=dev)
    if Kmax == 0:
        return seeds
    sizes = valid.sum(1)  # (T,)
    u = _uniforms(seed, Kmax, T, dev) if uniforms is None else uniforms.to(device=dev, dtype=torch.float64)
    rows = torch.arange(T, device=dev)
    first = torch.clamp((u[0] * sizes).long(), max=(sizes - 1).clamp(min=0))  # valid points are a prefix
    seeds[:, 0] = first
    sq = (X.float() * X.float()).sum(-1)  # (T, n)
    c = X[rows, first]  # (T, D)
    d2 = (sq - 2 * torch.einsum("tnd,td->tn", X.float(), c.float()) + (c.float() * c.float()).sum(-1)[:, None])
    d2 = d2.clamp(min=0).masked_fill(~valid, 0).double()  # (T, n)
    chosen = torch.zeros(T, n, dtype=torch.bool, device=dev)
    chosen[rows, first] = True
    for s in range(1, Kmax):
        active = k > s  # (T,)
        w = d2.masked_fill(chosen, 0)
        total = w.sum(1)  # (T,)
        cdf = torch.cumsum(w, 1)  # (T, n)
        pick = torch.searchsorted(cdf, (u[s] * total)[:, None], right=True)[:, 0]  # (T,)
        pick = torch.minimum(pick, (sizes - 1).clamp(min=0))
        # degenerate: no mass left (duplicates) -> first valid, unchosen point
        fallback = (valid & ~chosen).float().argmax(1)
        pick = torch.where(total > 0, pick, fallback)
        # the cdf can land on a zero-weight point at the right edge; step back to one with mass
        bad = (total > 0) & (w[rows, pick] <= 0)
        if bool(bad.any()):
            pick = torch.where(bad, (w > 0).float().argmax(1), pick)
        pick = torch.where(active, pick, torch.full_like(pick, -1))
        seeds[:, s] = pick
        p = pick.clamp(min=0)
        chosen[rows[active], p[active]] = True
        c = X[rows, p].float()  # (T, D)
        nd = (sq - 2 * torch.einsum("tnd,td->tn", X.float(), c) + (c * c).sum(-1)[:, None]).clamp(min=0)
        d2 = torch.where(active[:, None], torch.minimum(d2, nd.double().masked_fill(~valid, 0)), d2)
    return seeds


def cluster_means(X: torch.Tensor, valid: torch.Tensor, labels: torch.Tensor, K: int):
    """Per-cluster sums and counts. Shape: X (T, n, D), labels (T, n) -> means (T, K, D), counts (T, K)"""
    T, n, D = X.shape
    lab = labels.clamp(min=0)
    w = valid.to(X.dtype)
    flat = (torch.arange(T, device=X.device)[:, None] * K + lab).reshape(-1)  # (T*n,) row of sums
    sums = torch.zeros(T * K, D, dtype=torch.float32, device=X.device)
    sums.index_add_(0, flat, (X * w[:, :, None]).float().reshape(T * n, D))  # 3x faster than scatter_add_ on CPU
    sums = sums.view(T, K, D)
    counts = torch.zeros(T, K, dtype=torch.float32, device=X.device)
    counts.scatter_add_(1, lab, w.float())
    means = sums / counts.clamp(min=1)[:, :, None]
    return means, counts


def lloyd_step(X, valid, centroids, c_valid, *, budget: int = 1 << 24):
    """One assignment: each point to its nearest valid centroid (ties: lowest index).

    Shape: X (T, n, D), centroids (T, K, D), c_valid (T, K) -> labels (T, n) (-1 on padding), score (T, n)
    """
    score, labels = best_match(X, centroids, c_valid, mode="l2", budget=budget)
    labels = labels.masked_fill(~valid, -1)
    return labels, score


def kmeans(X: torch.Tensor, valid: torch.Tensor, k: torch.Tensor, *, max_iter: int = 30, seed: int = 0,
           uniforms: torch.Tensor | None = None, budget: int = 1 << 24, progress=None):
    """Batched k-means on padded problems.

    Each problem stops when none of its labels changes (later steps skip it, so a problem's
    result never depends on its batch-mates) or after ``max_iter`` assignments. An empty cluster is
    re-seeded with the point farthest from its centroid (distinct points for distinct
    empty clusters of one problem). Clusters still empty at the end are reported as
    invalid in ``c_valid``.

    Shape: X (T, n, D), valid (T, n), k (T,) -> labels (T, n), centroids (T, Kmax, D),
           c_valid (T, Kmax), iterations (int)
    """
    if max_iter < 1:
        raise ValueError(f"max_iter must be >= 1, got {max_iter!r}")
    T, n, D = X.shape
    Kmax = int(k.max()) if T else 0
    dev = X.device
    seeds = kmeans_plus_plus(X, valid, k, seed=seed, uniforms=uniforms)  # (T, Kmax)
    rows = torch.arange(T, device=dev)
    c_valid = seeds >= 0
    C = X[rows[:, None], seeds.clamp(min=0)].float()  # (T, Kmax, D)
    labels = torch.full((T, n), -1, dtype=torch.int64, device=dev)
    score = torch.zeros(T, n, dtype=torch.float32, device=dev)
    act = rows  # problems still iterating: each stops when its own labels stop changing
    it = 0
    for it in range(1, max_iter + 1):
        whole = act.shape[0] == T
        Xa, va = (X, valid) if whole else (X[act], valid[act])
        la, sa = lloyd_step(Xa, va, C if whole else C[act], c_valid if whole else c_valid[act], budget=budget)
        changed = (la != labels[act]).any(1) if it > 1 else torch.ones(act.shape[0], dtype=torch.bool, device=dev)
        labels[act], score[act] = la, sa.to(score.dtype)
        if progress is not None:
            progress(it)
        if it == max_iter or not bool(changed.any()):
            break
        if not bool(changed.all()):
            act, Xa, va, la, sa = act[changed], Xa[changed], va[changed], la[changed], sa[changed]
        Ca, counts = cluster_means(Xa, va, la, Kmax)
        empty = c_valid[act] & (counts == 0)  # (Ta, Kmax)
        if bool(empty.any()):
            # |x - c|^2 = |x|^2 - (2 x.c - |c|^2)
            dist = ((Xa.float() * Xa.float()).sum(-1) - sa).masked_fill(~va, float("-inf"))
            m = int(empty.sum(1).max())
            far = torch.topk(dist, k=min(m, n), dim=1).indices  # (Ta, m) farthest first
            rank = torch.cumsum(empty.long(), 1) - 1  # j-th empty cluster of its row
            sel = empty & (rank < far.shape[1])
            t_idx, k_idx = sel.nonzero(as_tuple=True)
            p_idx = far[t_idx, rank[t_idx, k_idx]]
            Ca[t_idx, k_idx] = Xa[t_idx, p_idx].float()
        C[act] = Ca
    means, counts = cluster_means(X, valid, labels, Kmax)
    c_valid = c_valid & (counts > 0)
    return labels, means, c_valid, it


def cluster_centres(X: torch.Tensor, valid: torch.Tensor, labels: torch.Tensor, means: torch.Tensor,
                    c_valid: torch.Tensor) -> torch.Tensor:
    """The member closest to each cluster's mean (ties: lowest point index).

    Shape: X (T, n, D), labels (T, n), means (T, K, D) -> centre (T, K) point index (-1 if empty)
    """
    T, n, D = X.shape
    K = means.shape[1]
    lab = labels.clamp(min=0)
    own = means[torch.arange(T, device=X.device)[:, None], lab]  # (T, n, D)
    d = ((X.float() - own) ** 2).sum(-1).masked_fill(~valid, float("inf"))  # (T, n)
    best = torch.full((T, K), float("inf"), device=X.device).scatter_reduce(1, lab, d, "amin")
    is_best = valid & (d == best.gather(1, lab))
    idx = torch.arange(n, device=X.device).expand(T, n)
    big = torch.full((T, K), n, dtype=torch.int64, device=X.device)
    centre = big.scatter_reduce(1, lab, torch.where(is_best, idx, torch.full_like(idx, n)), "amin")
    return torch.where(c_valid & (centre < n), centre, torch.full_like(centre, -1))
