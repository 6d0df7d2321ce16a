"""EventTree partitioning of one large tenant across ranks (SPEC section 1, sharded).

Every rank holds the tenant's embeddings. The k-means++ seeding is replicated (same
per-tenant random stream, so every rank draws the same seeds); the Lloyd steps are
sharded: rank r assigns a contiguous block of the tenant's time-ordered points, and the
centroid sums and counts are all-reduced in float64. Once labels stop changing the
labels are gathered and every rank finishes exactly like :func:`memforest_gpu.partition.partition`
(means, centre nodes, semantic + temporal reassignment), so all ranks agree on the trees.

Float caveat: the single-process k-means sums members in float32, this one in float64,
so centroids can differ in the last bits; a point whose two nearest centroids are within
that rounding of each other may take the other label. The labels are then the ones of an
equally valid k-means run, not necessarily the single-process ones (tests compare them
on data without such near-ties, where they are equal).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..config import PartitionConfig
from ..kernels import cluster_centres, kmeans_plus_plus, lloyd_step, reassign_to_centres
from ..kernels.kmeans import cluster_means
from ..partition import n_clusters, tenant_uniforms

__all__ = ["sharded_kmeans", "partition_tenant", "shard_range"]


def _world(group=None) -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    return 0, 1


def _comm_device(x: torch.Tensor) -> torch.device:
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_reduce(t: torch.Tensor, op=None, group=None) -> torch.Tensor:
    if _world(group)[1] == 1:
        return t
    c = t.to(_comm_device(t))
    dist.all_reduce(c, op=op or dist.ReduceOp.SUM, group=group)
    return c.to(t.device)


def _all_gather_cat(t: torch.Tensor, group=None) -> torch.Tensor:
    """Concatenate every rank's tensor along dim 0 (sizes may differ), in rank order."""
    rank, world = _world(group)
    if world == 1:
        return t
    out: list = [None] * world
    dist.all_gather_object(out, t.cpu(), group=group)
    return torch.cat(out, 0).to(t.device)


def shard_range(n: int, rank: int, world: int) -> tuple[int, int]:
    """Rank ``rank``'s contiguous block [lo, hi) of ``n`` items (sizes differ by at most 1)."""
    return n * rank // world, n * (rank + 1) // world


def sharded_kmeans(X: torch.Tensor, k: int, *, uniforms: torch.Tensor, max_iter: int = 30,
                   budget: int = 1 << 24, group=None):
    """k-means of one problem with Lloyd steps sharded over the ranks of ``group``; the
    same rules as :func:`memforest_gpu.kernels.kmeans` (k-means++ from ``uniforms``, stop
    when no label changes, an empty cluster re-seeded with the farthest point). Every
    rank passes the whole ``X`` and gets the whole result.

    Shape: X (n, D), uniforms (k,) -> labels (n,), c_valid (k,), iterations (int)
    """
    n, D = X.shape
    dev = X.device
    rank, world = _world(group)
    valid_all = torch.ones(1, n, dtype=torch.bool, device=dev)
    kk = torch.tensor([k], dtype=torch.int64, device=dev)
    seeds = kmeans_plus_plus(X[None], valid_all, kk, uniforms=uniforms.reshape(-1, 1))[0]  # (k,) replicated
    c_valid = seeds >= 0
    C = X[seeds.clamp(min=0)].float()[None]  # (1, k, D)
    lo, hi = shard_range(n, rank, world)
    Xs = X[lo:hi][None]  # (1, n_r, D)
    vs = torch.ones(1, hi - lo, dtype=torch.bool, device=dev)
    prev = None
    it = 0
    for it in range(1, max_iter + 1):
        labels, score = lloyd_step(Xs, vs, C, c_valid[None], budget=budget)  # (1, n_r)
        changed = torch.tensor([1.0 if prev is None else float(bool((labels != prev).any()))], device=dev)
        changed = _all_reduce(changed, dist.ReduceOp.MAX if world > 1 else None, group)
        if prev is not None and float(changed) == 0.0:
            break
        prev = labels
        if it == max_iter:
            break
        lab = labels[0]
        sums = torch.zeros(k, D, dtype=torch.float64, device=dev).index_add_(0, lab, Xs[0].double())
        counts = torch.zeros(k, dtype=torch.float64, device=dev).index_add_(
            0, lab, torch.ones(hi - lo, dtype=torch.float64, device=dev))
        sums, counts = _all_reduce(sums, group=group), _all_reduce(counts, group=group)
        C = (sums / counts.clamp(min=1)[:, None]).float()[None]  # (1, k, D)
        empty = c_valid & (counts == 0)  # (k,)
        if bool(empty.any()):
            m = int(empty.sum())
            dist_r = (Xs[0].float() * Xs[0].float()).sum(-1) - score[0]  # (n_r,) |x - c|^2
            top = torch.topk(dist_r, k=min(m, hi - lo)) if hi > lo else None
            cand_d = top.values if top is not None else dist_r[:0]
            cand_i = (top.indices + lo) if top is not None else torch.zeros(0, dtype=torch.int64, device=dev)
            d_all, i_all = _all_gather_cat(cand_d, group), _all_gather_cat(cand_i, group)
            o = torch.argsort(i_all, stable=True)  # farthest first, ties: lower index
            o = o[torch.argsort(d_all[o], descending=True, stable=True)][:m]
            far = i_all[o]
            C[0, torch.nonzero(empty).flatten()[: len(far)]] = X[far].float()
    labels = _all_gather_cat(prev[0], group)  # (n,)
    return labels, c_valid, it


def partition_tenant(embeddings: torch.Tensor, timestamps: torch.Tensor, name: str, cfg: PartitionConfig, *,
                     budget: int = 1 << 24, group=None) -> tuple[torch.Tensor, int]:
    """The EventTrees of one tenant, computed by all ranks of ``group`` together; every
    rank gets the same answer. Trees are numbered by cluster id (the engine's tree order
    inside a tenant).

    Shape: embeddings (n, D) normalised, timestamps (n,) in store order -> tree (n,) int64, iterations
    """
    n = embeddings.shape[0]
    dev = embeddings.device
    order = torch.argsort(timestamps, stable=True)  # time order = position
    X = embeddings[order]  # (n, D)
    k = n_clusters(n, cfg.alpha)
    u = tenant_uniforms([name], [k], cfg.seed, dev)[:, 0]  # (k,)
    labels, c_valid, it = sharded_kmeans(X, k, uniforms=u, max_iter=cfg.max_iter, budget=budget, group=group)
    valid = torch.ones(1, n, dtype=torch.bool, device=dev)
    means, counts = cluster_means(X[None], valid, labels[None], k)
    c_valid = c_valid[None] & (counts > 0)  # (1, k)
    centre = cluster_centres(X[None], valid, labels[None], means, c_valid)  # (1, k)
    new = reassign_to_centres(X[None], valid, labels[None], centre, beta=cfg.beta, window=cfg.window,
                              use_semantic=cfg.use_semantic, use_temporal=cfg.use_temporal, budget=budget)[0]
    tree = torch.empty(n, dtype=torch.int64, device=dev)
    tree[order] = new
    return tree, it
