"""EventTree partitioning (SPEC section 1): k-means + semantic/temporal reassignment,
run for all tenants at once (tenants of similar size share one padded batch)."""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np
import torch

from .config import PartitionConfig
from .kernels import cluster_centres, kmeans, pack_segments, reassign_to_centres, size_buckets
from .kernels.rand import stream_keys
from .two_level import two_level_clusters

__all__ = ["Partition", "partition", "time_order", "n_clusters", "tenant_uniforms", "tenant_streams"]


@dataclass
class Partition:
    """Result of partitioning. ``tree`` (N,) global tree id per node; ``tree_tenant`` (T,)
    tenant code per tree; ``centre`` (T,) node index of each tree's centre node;
    ``kmeans_labels`` (N,) cluster before reassignment (same id space as ``tree``)."""

    tree: torch.Tensor
    tree_tenant: torch.Tensor
    centre: torch.Tensor
    kmeans_tree: torch.Tensor
    iterations: dict
    moved: int


def n_clusters(n: int, alpha: float) -> int:
    """K = max(1, min(n, floor(alpha * n)))"""
    return max(1, min(n, int(math.floor(alpha * n))))


def time_order(codes: torch.Tensor, timestamps: torch.Tensor) -> torch.Tensor:
    """Node indices sorted by (tenant, timestamp, index). Shape: (N,), (N,) -> (N,)"""
    o = torch.argsort(timestamps, stable=True)
    return o[torch.argsort(codes[o], stable=True)]


def tenant_uniforms(names: list[str], k: list[int], seed: int, device) -> torch.Tensor:
    """Per-tenant random streams for k-means++: tenant ``t`` draws from a generator
    seeded with (seed, crc32(name)), so its clusters never depend on other tenants.
    Shape: -> (Kmax, T) float64"""
    Kmax = max(k) if k else 0
    u = np.zeros((Kmax, len(names)), dtype=np.float64)
    for j, (name, kk) in enumerate(zip(names, k)):
        u[:kk, j] = np.random.default_rng([int(seed), zlib.crc32(name.encode("utf-8"))]).random(kk)
    return torch.from_numpy(u).to(device)


def tenant_streams(names: list[str], device, salt: int = 0) -> torch.Tensor:
    """Per-tenant random stream keys for the batched seeding: crc32 of the name (plus a
    salt), so a tenant's clusters never depend on other tenants. Shape: -> (T,) int64"""
    return stream_keys([zlib.crc32(n.encode("utf-8")) * 131 + salt for n in names], device=device)


def partition(embeddings: torch.Tensor, timestamps: torch.Tensor, codes: torch.Tensor, names: list[str],
              cfg: PartitionConfig, *, budget: int = 1 << 24, progress=None) -> Partition:
    """Split every tenant's nodes into EventTrees.

    Shape: embeddings (N, D) normalised, timestamps (N,), codes (N,) tenant code in
           [0, len(names)) -> Partition with tree (N,)
    """
    N, D = embeddings.shape
    dev = embeddings.device
    n_ten = len(names)
    order = time_order(codes, timestamps)
    index, valid, sizes = pack_segments(codes, n_ten, order=order)  # (S, n): column = position
    tree_local = torch.full((N,), -1, dtype=torch.int64, device=dev)
    km_local = torch.full((N,), -1, dtype=torch.int64, device=dev)
    centre_node: dict[int, torch.Tensor] = {}
    kmax_per_tenant = torch.zeros(n_ten, dtype=torch.int64)
    iters: dict[str, int] = {}
    moved = 0
    two_level = torch.zeros(n_ten, dtype=torch.bool)
    if cfg.kmeans == "two-level":
        two_level = (sizes.cpu() >= cfg.two_level_min_nodes) & (
            torch.tensor([n_clusters(int(x), cfg.alpha) for x in sizes.tolist()]) >= 4)
    for t in torch.nonzero(two_level).flatten().tolist():
        n_t = int(sizes[t])
        idx = index[t, :n_t]  # (n_t,) node ids in time order
        X = embeddings[idx]
        labels, centre, _, _, _, sem, it2 = two_level_clusters(
            X, n_clusters(n_t, cfg.alpha), name=names[t], seed=cfg.seed, max_iter=cfg.max_iter, budget=budget,
            seeding=cfg.seeding)
        val = torch.ones(1, n_t, dtype=torch.bool, device=dev)
        new = reassign_to_centres(X[None], val, labels[None], centre[None], beta=cfg.beta, window=cfg.window,
                                  use_semantic=cfg.use_semantic, use_temporal=cfg.use_temporal, budget=budget,
                                  semantic=(sem[0][None], sem[1][None]))[0]
        moved += int((new != labels).sum())
        tree_local[idx] = new
        km_local[idx] = labels
        centre_node[t] = idx[centre]
        kmax_per_tenant[t] = centre.shape[0]
        iters[f"two-level n={n_t}"] = it2
        if progress is not None:
            progress(n_t)
    exact_sizes = sizes.masked_fill(two_level.to(sizes.device), 0)
    for bucket in size_buckets(exact_sizes):
        idx = index[bucket]  # (Tb, n)
        n_b = int(sizes[bucket].max())
        idx, val = idx[:, :n_b], valid[bucket][:, :n_b]
        X = embeddings[idx.clamp(min=0)] * val[:, :, None]  # (Tb, n, D)
        ks = [n_clusters(int(s), cfg.alpha) for s in sizes[bucket].tolist()]
        k = torch.tensor(ks, dtype=torch.int64, device=dev)
        who = [names[t] for t in bucket.tolist()]
        u = tenant_uniforms(who, ks, cfg.seed, dev) if cfg.seeding == "k-means++" else None
        labels, means, c_valid, it = kmeans(X, val, k, max_iter=cfg.max_iter, seed=cfg.seed, seeding=cfg.seeding,
                                            streams=tenant_streams(who, dev), uniforms=u, budget=budget)
        centre = cluster_centres(X, val, labels, means, c_valid)  # (Tb, K) column index
        new = reassign_to_centres(X, val, labels, centre, beta=cfg.beta, window=cfg.window,
                                  use_semantic=cfg.use_semantic, use_temporal=cfg.use_temporal, budget=budget)
        moved += int(((new != labels) & val).sum())
        tree_local[idx[val]] = new[val]
        km_local[idx[val]] = labels[val]
        for j, t in enumerate(bucket.tolist()):
            centre_node[t] = torch.where(c_valid[j], idx[j][centre[j].clamp(min=0)], torch.full_like(centre[j], -1))
            kmax_per_tenant[t] = centre.shape[1]
        iters[f"n<={n_b}"] = it
        if progress is not None:
            progress(int(val.sum()))
    # global tree ids: (tenant, local cluster) -> consecutive ids over clusters that have members
    stride = int(kmax_per_tenant.max()) if n_ten else 1
    gid = codes * stride + tree_local  # (N,)
    gkm = codes * stride + km_local
    uniq, tree = torch.unique(gid, return_inverse=True)  # sorted: tenant-major, then cluster id
    km_tree = torch.searchsorted(uniq, gkm)
    tree_tenant = uniq // stride
    centre = torch.full((uniq.shape[0],), -1, dtype=torch.int64, device=dev)
    for t, cn in centre_node.items():
        lab = torch.arange(cn.shape[0], device=dev) + t * stride
        ok = cn >= 0
        pos = torch.searchsorted(uniq, lab[ok])
        centre[pos] = cn[ok]
    return Partition(tree, tree_tenant, centre, km_tree, iters, moved)
