"""Batched k-means (Euclidean, D^2 seeding, Lloyd steps) over padded problems.

Each row of the batch is an independent problem (one tenant): its own points, its own
number of clusters. Assignment uses the tiled :func:`best_match`, so no (n, K) matrix
is ever held in full.

Seeding (``seeding=``, :mod:`.seeding`): ``"batched"`` (default, D^2 sampling in growing
batches, O(log K) steps with no device read) or ``"k-means++"`` (one centre per step, exact
to the method's wording).

A Lloyd step reads the device once (how many problems go on, their most empty and most moved
clusters, in one copy), and once more when it skips settled points (:mod:`.settled`, CPU only:
the points whose label provably cannot change are not recomputed; the same labels bit for bit).
Cluster sums are accumulated in float64 (``index_put_(accumulate=True)``, a cache-sized tile
of points at a time on the CPU, where it then costs about one read of the points; unlike
``index_add_`` its cost does not grow with the number of clusters when torch runs several
threads). On the CPU the order is fixed; PyTorch's CUDA kernel for it sorts the indices
first, so the sums do not depend on thread scheduling there either.

The reduction is pluggable (``reduce=``): the distributed runner passes one that
all-reduces sums, counts and the "changed" flag over ranks that each hold a shard of the
points, so there is one k-means, sharded or not.
"""
from __future__ import annotations

import torch

from .assign import best_match
from .blocks import row_blocks, stream_rows
from .choices import SEEDINGS
from .seeding import batched_d2_seeds, kmeans_plus_plus, parallel_seeds
from .settled import SettledRows

__all__ = ["kmeans", "lloyd_step", "initial_centroids", "cluster_means", "cluster_centres", "LocalReduce", "SEEDINGS"]


def cluster_means(X: torch.Tensor, valid: torch.Tensor, labels: torch.Tensor, K: int, *, reduce=None,
                  tile: int | None = None):
    """Per-cluster means and counts; sums accumulated in float64 a tile of points at a time
    (``tile``: default a cache-sized block on the CPU, :func:`~.blocks.stream_rows`), with no
    float64 copy of the whole X. Padding and unlabelled points go to a spare row that is
    dropped. ``reduce`` (see :class:`LocalReduce`) combines the sums of several shards before
    dividing.

    Shape: X (T, n, D), labels (T, n) -> means (T, K, D) float32, counts (T, K) float64
    """
    T, n, D = X.shape
    w = valid & (labels >= 0)
    spare = T * K  # the row that padding and unlabelled points add into
    flat = torch.where(w, torch.arange(T, device=X.device)[:, None] * K + labels.clamp(min=0), spare).reshape(-1)
    Xf = X.reshape(T * n, D)
    tile = tile or stream_rows(X.device, D * 12)  # a float32 row read, a float64 row written
    sums = torch.zeros(T * K + 1, D, dtype=torch.float64, device=X.device)
    for r0 in range(0, T * n, tile):
        sums.index_put_((flat[r0:r0 + tile],), Xf[r0:r0 + tile].double(), accumulate=True)
    counts = torch.bincount(flat, minlength=T * K + 1)[:spare].to(torch.float64)
    sums, counts = sums[:spare].view(T, K, D), counts.view(T, K)
    if reduce is not None:
        sums, counts = reduce.sum(sums), reduce.sum(counts)
    return (sums / counts.clamp(min=1)[:, :, None]).float(), counts


class LocalReduce:
    """The single-process reduction of :func:`kmeans`: every point is here.

    A sharded run passes an object with the same three methods that combines the ranks'
    shards (``memforest_gpu.distributed.kmeans.ShardReduce``).
    """

    def __init__(self, X: torch.Tensor, valid: torch.Tensor):
        self.X, self.valid = X, valid

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def any(self, flags: torch.Tensor) -> torch.Tensor:
        return flags

    def farthest(self, act: torch.Tensor, dist: torch.Tensor, m: int) -> torch.Tensor:
        """The ``m`` points farthest from their centroid per active problem, farthest first
        (ties: lower index). Shape: act (Ta,), dist (Ta, n) -> (Ta, m, D) float32"""
        far = torch.sort(dist, dim=1, descending=True, stable=True).indices[:, :m]  # (Ta, m)
        return self.X[act[:, None], far].float()

    def gather(self, labels: torch.Tensor) -> torch.Tensor:
        return labels


def lloyd_step(X, valid, centroids, c_valid, *, tile_elements: int = 1 << 24):
    """One assignment: each point to its nearest valid centroid (ties: lowest index).

    Shape: X (T, n, D), centroids (T, K, D), c_valid (T, K) -> labels (T, n) (-1 on padding),
           score (T, n)
    """
    score, labels = best_match(X, centroids, c_valid, mode="l2", tile_elements=tile_elements)
    labels = labels.masked_fill(~valid, -1)
    return labels, score


def initial_centroids(X: torch.Tensor, valid: torch.Tensor, k: torch.Tensor, *, seeding: str = "batched",
                      seed: int = 0, streams: torch.Tensor | None = None, uniforms: torch.Tensor | None = None,
                      tile_elements: int = 1 << 24, kmax: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeds as centroids (``kmax``: the columns, default ``k.max()``; the batched seeding's
    steps follow it). Shape: -> C (T, Kmax, D) float32, c_valid (T, Kmax)"""
    if seeding not in SEEDINGS:
        raise ValueError(f"seeding must be one of {list(SEEDINGS)}, got {seeding!r}")
    if uniforms is not None and seeding != "k-means++":
        raise ValueError(f"uniforms are the k-means++ seeding's random numbers: pass seeding='k-means++', "
                         f"got seeding={seeding!r}")
    if seeding == "batched":
        seeds = batched_d2_seeds(X, valid, k, seed=seed, streams=streams, tile_elements=tile_elements, kmax=kmax)
    elif seeding == "k-means||":
        seeds = parallel_seeds(X, valid, k, seed=seed, streams=streams, tile_elements=tile_elements, kmax=kmax)
    else:
        seeds = kmeans_plus_plus(X, valid, k, seed=seed, uniforms=uniforms)
        if kmax is not None and kmax > seeds.shape[1]:
            seeds = torch.cat([seeds, seeds.new_full((seeds.shape[0], kmax - seeds.shape[1]), -1)], 1)
    rows = torch.arange(X.shape[0], device=X.device)
    return X[rows[:, None], seeds.clamp(min=0)].float(), seeds >= 0


def kmeans(X: torch.Tensor, valid: torch.Tensor, k: torch.Tensor, *, max_iter: int = 30, seed: int = 0,
           seeding: str = "batched", streams: torch.Tensor | None = None, uniforms: torch.Tensor | None = None,
           init: tuple[torch.Tensor, torch.Tensor] | None = None, reduce=None, tile_elements: int = 1 << 24,
           progress=None, kmax: int | None = None, prune: bool = True):
    """Batched k-means on padded problems.

    Each problem stops when none of its labels changes (later steps skip it, so a problem's
    result never depends on its batch-mates) or after ``max_iter`` assignments. An empty cluster is
    re-seeded with the point farthest from its centroid (distinct points for distinct
    empty clusters of one problem). Clusters still empty at the end are reported as
    invalid in ``c_valid``.

    ``seeding`` / ``streams`` / ``uniforms``: see :func:`initial_centroids`; ``init``: ready
    centroids ``(C, c_valid)`` instead. ``reduce``: how shards combine (default
    :class:`LocalReduce`, all points here). ``kmax``: the centroids' columns (default
    ``k.max()``): a block of a bucket's problems passes the bucket's, so that every product has
    the shape (and so the rounding) it has when the bucket runs whole. ``prune``: skip the points
    whose label cannot change (:mod:`.settled`, CPU; the same labels either way).

    One host read a step (the problems that go on, their most empty and most moved clusters),
    plus one in a step that skips points (how many to recompute).

    Shape: X (T, n, D), valid (T, n), k (T,) -> labels (T, n), centroids (T, Kmax, D),
           c_valid (T, Kmax), iterations (int)
    """
    if max_iter < 1:
        raise ValueError(f"max_iter must be >= 1, got {max_iter!r}")
    T, n, D = X.shape
    dev = X.device
    if init is None:
        C, c_valid = initial_centroids(X, valid, k, seeding=seeding, seed=seed, streams=streams,
                                       uniforms=uniforms, tile_elements=tile_elements, kmax=kmax)
    else:
        C, c_valid = init[0].float().clone(), init[1]
    Kmax = C.shape[1]
    red = reduce if reduce is not None else LocalReduce(X, valid)
    labels = torch.full((T, n), -1, dtype=torch.int64, device=dev)
    act = torch.arange(T, device=dev)  # problems still iterating: each stops when its own labels stop changing
    Xa, va = X, valid  # their points: X until some stop, then one copy of the active ones' (never two)
    settle = SettledRows(X, valid, tile_elements=tile_elements) if prune and SettledRows.usable(X, Kmax) else None
    moved, n_moved, means = None, 0, None
    it = 0
    for it in range(1, max_iter + 1):
        whole = act.shape[0] == T
        Cc, cv = (C, c_valid) if whole else (C[act], c_valid[act])
        la, sa = settle.step(Xa, va, Cc, cv, moved, n_moved) if settle is not None \
            else lloyd_step(Xa, va, Cc, cv, tile_elements=tile_elements)
        changed = (la != labels[act]).any(1) if it > 1 else torch.ones(act.shape[0], dtype=torch.bool, device=dev)
        changed = red.any(changed)  # (Ta,) on every shard alike
        labels[act] = la
        if progress is not None:
            progress(it)
        if it == max_iter:
            break
        Ca, counts = cluster_means(Xa, va, la, Kmax, reduce=red)
        empty = cv & (counts == 0)  # (Ta, Kmax)
        moved = (Ca != Cc).any(-1) | empty  # the centroids that can change (re-seeding moves only empty ones)
        # one host read a step: how many problems go on, their most empty clusters, their most moved centroids
        live = changed[:, None]
        n_go, n_empty, n_moved = torch.stack([changed.sum(), (empty & live).sum(1).max(),
                                              (moved & live).sum(1).max()]).tolist()
        if n_go == 0:
            means = (Ca, counts) if whole else None  # what the final means would recompute
            break
        if n_empty and settle is not None and settle.pruned:  # re-seeding reads the scores: the exact ones
            la, sa = settle.exact(Xa, va, Cc, cv)
        if n_go < act.shape[0]:
            act, la, sa, Ca, Cc, empty, moved = (t[changed] for t in (act, la, sa, Ca, Cc, empty, moved))
            Xa = va = None  # the previous copy goes before the next one is gathered
            Xa, va = X[act], valid[act]
            if settle is not None:
                settle.keep(changed)
        if n_empty:
            Ca = _reseed(Xa, va, sa, Ca, empty, n_empty, act, red, tile_elements)
        C[act] = Ca
    means, counts = means if means is not None else cluster_means(X, valid, labels, Kmax, reduce=red)
    c_valid = c_valid & (counts > 0)
    return red.gather(labels), means, c_valid, it


def _reseed(Xa, va, sa, Ca, empty, m: int, act, red, tile_elements: int) -> torch.Tensor:
    """Every empty cluster re-seeded with the point farthest from its centroid (distinct points for
    distinct empty clusters of one problem, farthest first; ``m`` the most empty clusters of one).
    Shape: Xa (Ta, n, D), sa (Ta, n) best scores, Ca (Ta, K, D), empty (Ta, K) -> Ca (Ta, K, D)"""
    Ta, n, D = Xa.shape
    # |x - c|^2 = |x|^2 - (2 x.c - |c|^2); |x|^2 a block at a time (see row_blocks)
    sq = torch.empty(Xa.shape[:2], dtype=torch.float32, device=Xa.device)  # (Ta, n)
    for cs in row_blocks(n, tile_elements // max(1, Ta * D)):
        sq[:, cs] = (Xa[:, cs].float() * Xa[:, cs].float()).sum(-1)
    dist = (sq - sa).masked_fill(~va, float("-inf"))
    far = red.farthest(act, dist, m)  # (Ta, m, D) farthest first
    if far.shape[1] == 0:
        return Ca
    rank = torch.cumsum(empty.long(), 1) - 1  # j-th empty cluster of its row
    sel = empty & (rank < far.shape[1])
    pick = far.gather(1, rank.clamp(0, far.shape[1] - 1)[:, :, None].expand(-1, -1, D))  # (Ta, K, D)
    return torch.where(sel[:, :, None], pick, Ca)


def cluster_centres(X: torch.Tensor, valid: torch.Tensor, labels: torch.Tensor, means: torch.Tensor,
                    c_valid: torch.Tensor, *, tile_elements: int = 1 << 24) -> torch.Tensor:
    """The member closest to each cluster's mean (ties: lowest point index). Distances are
    computed ``tile_elements`` elements at a time (no (T, n, D) temporary).

    Shape: X (T, n, D), labels (T, n), means (T, K, D) -> centre (T, K) point index (-1 if empty)
    """
    T, n, D = X.shape
    K = means.shape[1]
    lab = labels.clamp(min=0)
    rows = torch.arange(T, device=X.device)[:, None]
    d = torch.empty(T, n, dtype=torch.promote_types(torch.float32, means.dtype), device=X.device)  # (T, n)
    for cs in row_blocks(n, tile_elements // max(1, T * D)):  # the same bits as all at once (see row_blocks)
        d[:, cs] = ((X[:, cs].float() - means[rows, lab[:, cs]]) ** 2).sum(-1)
    d = d.masked_fill(~valid, float("inf"))
    best = torch.full((T, K), float("inf"), device=X.device).scatter_reduce(1, lab, d, "amin")
    is_best = valid & (d == best.gather(1, lab))
    idx = torch.arange(n, device=X.device).expand(T, n)
    big = torch.full((T, K), n, dtype=torch.int64, device=X.device)
    centre = big.scatter_reduce(1, lab, torch.where(is_best, idx, torch.full_like(idx, n)), "amin")
    return torch.where(c_valid & (centre < n), centre, torch.full_like(centre, -1))
