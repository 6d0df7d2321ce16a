"""EventTree partitioning of one large tenant across ranks (docs/method.md section 1, sharded).

Every rank holds the tenant's embeddings. The seeding is replicated (same per-tenant
random stream, so every rank draws the same seeds); the Lloyd steps are sharded: rank r
assigns a contiguous block of the tenant's time-ordered points, and the float64 centroid
sums and counts are all-reduced. It is the package's one k-means
(:func:`memforest_gpu.kernels.lloyd.kmeans`) with :class:`ShardReduce` plugged in. Once labels
stop changing they are gathered and every rank finishes exactly like
:func:`memforest_gpu.engine.partition.partition_nodes` (means, centre nodes, semantic + temporal
reassignment), so all ranks agree on the trees.

Float caveat: sharded sums add the same float64 terms in another order than one process
does, so centroids can differ in the last bits (~1e-16 relative); a point whose two
nearest centroids score within that of the tie tolerance may take the other label (tests
compare on data without such near-ties, where they are equal).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..config import PartitionConfig
from ..engine.partition import n_clusters, tenant_streams, tenant_uniforms
from ..kernels.lloyd import cluster_centres, cluster_means, initial_centroids, kmeans
from ..kernels.reassign import reassign_to_centres
from .ranks import world_of

__all__ = ["sharded_kmeans", "partition_tenant", "shard_range", "ShardReduce"]


def _comm_device(x: torch.Tensor) -> torch.device:
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_reduce(t: torch.Tensor, op=None, group=None) -> torch.Tensor:
    if world_of(group)[1] == 1:
        return t
    c = t.to(_comm_device(t))
    dist.all_reduce(c, op=op or dist.ReduceOp.SUM, group=group)
    return c.to(t.device)


def _all_gather_cat(t: torch.Tensor, group=None) -> torch.Tensor:
    """Concatenate every rank's tensor along dim 0 (sizes may differ), in rank order."""
    rank, world = world_of(group)
    if world == 1:
        return t
    out: list = [None] * world
    dist.all_gather_object(out, t.cpu(), group=group)
    return torch.cat(out, 0).to(t.device)


def shard_range(n: int, rank: int, world: int) -> tuple[int, int]:
    """Rank ``rank``'s contiguous block [lo, hi) of ``n`` items (sizes differ by at most 1)."""
    return n * rank // world, n * (rank + 1) // world


class ShardReduce:
    """:func:`memforest_gpu.kernels.lloyd.kmeans`'s reduction over ranks: this rank holds the points
    [lo, hi) of the (single) problem, every rank also holds all of ``X``. Sums, counts and
    the "changed" flag are all-reduced; the farthest points for empty clusters are chosen
    over all shards (ties: lower global index); labels are gathered in rank order."""

    def __init__(self, X: torch.Tensor, lo: int, group=None):
        self.X, self.lo, self.group = X, lo, group
        self.world = world_of(group)[1]

    def sum(self, t: torch.Tensor) -> torch.Tensor:
        return _all_reduce(t, group=self.group)

    def any(self, flags: torch.Tensor) -> torch.Tensor:
        if self.world == 1:
            return flags
        return _all_reduce(flags.float(), dist.ReduceOp.MAX, self.group) > 0

    def farthest(self, act: torch.Tensor, dist_: torch.Tensor, m: int) -> torch.Tensor:
        top = torch.sort(dist_[0], descending=True, stable=True)  # one problem per sharded call
        cand_d, cand_i = top.values[:m], top.indices[:m] + self.lo
        d_all, i_all = _all_gather_cat(cand_d, self.group), _all_gather_cat(cand_i, self.group)
        o = torch.argsort(i_all, stable=True)  # farthest first, ties: lower index
        o = o[torch.argsort(d_all[o], descending=True, stable=True)][:m]
        return self.X[i_all[o]].float()[None]  # (1, m', D)

    def gather(self, labels: torch.Tensor) -> torch.Tensor:
        return _all_gather_cat(labels[0], self.group)[None]


def sharded_kmeans(X: torch.Tensor, k: int, *, stream: torch.Tensor, seed: int = 0, seeding: str = "batched",
                   uniforms: torch.Tensor | None = None, max_iter: int = 30, tile_elements: int = 1 << 24, group=None):
    """k-means of one problem with Lloyd steps sharded over the ranks of ``group``: the one
    :func:`memforest_gpu.kernels.lloyd.kmeans`, with the seeding replicated (every rank draws the
    same seeds from ``stream``) and :class:`ShardReduce` as its reduction. Every rank
    passes the whole ``X`` and gets the whole result.

    Shape: X (n, D), stream (1,) -> labels (n,), c_valid (k,), iterations (int)
    """
    n, D = X.shape
    dev = X.device
    rank, world = world_of(group)
    kk = torch.tensor([k], dtype=torch.int64, device=dev)
    init = initial_centroids(X[None], torch.ones(1, n, dtype=torch.bool, device=dev), kk, seeding=seeding,
                             seed=seed, streams=stream, uniforms=None if uniforms is None else uniforms.reshape(-1, 1),
                             tile_elements=tile_elements)
    lo, hi = shard_range(n, rank, world)
    labels, _, c_valid, it = kmeans(X[lo:hi][None], torch.ones(1, hi - lo, dtype=torch.bool, device=dev), kk,
                                    max_iter=max_iter, init=init, reduce=ShardReduce(X, lo, group),
                                    tile_elements=tile_elements)
    return labels[0], c_valid[0], it


def partition_tenant(embeddings: torch.Tensor, timestamps: torch.Tensor, name: str, cfg: PartitionConfig, *,
                     tile_elements: int = 1 << 24, group=None) -> tuple[torch.Tensor, int, int]:
    """The EventTrees of one tenant, computed by all ranks of ``group`` together; every
    rank gets the same answer. Trees are numbered by cluster id (the engine's tree order
    inside a tenant).

    Shape: embeddings (n, D) normalised, timestamps (n,) in store order -> tree (n,) int64,
           k-means iterations, nodes the reassignment moved
    """
    n = embeddings.shape[0]
    dev = embeddings.device
    order = torch.argsort(timestamps, stable=True)  # time order = position
    X = embeddings[order]  # (n, D)
    k = n_clusters(n, cfg.alpha)
    u = tenant_uniforms([name], [k], cfg.seed, dev)[:, 0] if cfg.seeding == "k-means++" else None  # (k,)
    labels, c_valid, it = sharded_kmeans(X, k, stream=tenant_streams([name], dev), seed=cfg.seed,
                                         seeding=cfg.seeding, uniforms=u, max_iter=cfg.max_iter,
                                         tile_elements=tile_elements, group=group)
    valid = torch.ones(1, n, dtype=torch.bool, device=dev)
    means, counts = cluster_means(X[None], valid, labels[None], k)
    c_valid = c_valid[None] & (counts > 0)  # (1, k)
    centre = cluster_centres(X[None], valid, labels[None], means, c_valid)  # (1, k)
    new = reassign_to_centres(X[None], valid, labels[None], centre, beta=cfg.beta, window=cfg.window,
                              use_semantic=cfg.use_semantic, use_temporal=cfg.use_temporal,
                              tile_elements=tile_elements)[0]
    tree = torch.empty(n, dtype=torch.int64, device=dev)
    tree[order] = new
    return tree, it, int((new != labels).sum())
