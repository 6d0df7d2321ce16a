"""EventTree partitioning (docs/method.md section 1): k-means + semantic/temporal reassignment,
run for all tenants at once (tenants of similar size share one padded batch; tenants with
K = 1 take a closed form, all together; no Python loop per tenant but over the few
two-level ones)."""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np
import torch

from ..config import PartitionConfig
from ..kernels.blocks import gather_bytes, problem_blocks, row_blocks, stream_rows
from ..kernels.lloyd import cluster_centres, kmeans
from ..kernels.padding import size_buckets
from ..kernels.rand import stream_keys
from ..kernels.reassign import reassign_to_centres
from .two_level import two_level_clusters

__all__ = ["Partition", "partition_nodes", "time_order", "n_clusters", "tenant_uniforms", "tenant_streams",
           "tenant_stream_keys", "closed_form_centres"]


@dataclass
class Partition:
    """Result of partitioning. ``tree`` (N,) global tree id per node; ``tree_tenant`` (T,)
    tenant code per tree; ``centre`` (T,) node index of each tree's centre node;
    ``kmeans_tree`` (N,) each node's k-means cluster before the reassignment (the same id
    space as ``tree``); ``iterations``: Lloyd steps per tenant group; ``moved``: nodes the
    reassignment moved."""

    tree: torch.Tensor
    tree_tenant: torch.Tensor
    centre: torch.Tensor
    kmeans_tree: torch.Tensor
    iterations: dict
    moved: int


def n_clusters(n, alpha: float):
    """K = max(1, min(n, floor(alpha * n))), for one tenant size (an int) or an array of them.
    Shape: n () or (T,) -> the same"""
    k = np.maximum(1, np.minimum(n, np.floor(alpha * np.asarray(n, dtype=np.float64)).astype(np.int64)))
    return int(k) if np.ndim(k) == 0 else k


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


def tenant_stream_keys(names: list[str], tenants: np.ndarray, device) -> torch.Tensor:
    """:func:`tenant_streams` of the tenants ``tenants`` (codes into ``names``): the one place
    a run turns names into stream keys (one crc32 per tenant that runs k-means, once).
    Shape: tenants (T',) -> (T',) int64"""
    return tenant_streams([names[t] for t in np.asarray(tenants).tolist()], device)


def _segment_index(order: torch.Tensor, starts: torch.Tensor, sizes: torch.Tensor, n: int):
    """The padded (T', n) layout of whole tenants cut from ``order`` (sorted by tenant, then
    time): row j holds the ``sizes[j]`` node ids from ``starts[j]`` on, column = position.
    Shape: order (N,), starts, sizes (T',) -> index (T', n) (-1 = padding), valid (T', n)"""
    col = torch.arange(n, device=order.device)
    valid = col[None, :] < sizes[:, None]
    at = (starts[:, None] + col[None, :]).clamp(max=max(order.shape[0] - 1, 0))
    return torch.where(valid, order[at], torch.full_like(at, -1)), valid


def closed_form_centres(embeddings: torch.Tensor, order: torch.Tensor, codes: torch.Tensor, one: torch.Tensor,
                        n_ten: int) -> torch.Tensor:
    """The centre node of every tenant whose K is 1, without k-means: the whole tenant is one
    cluster, and its centre is what :func:`~memforest_gpu.kernels.cluster_centres` picks
    for it, computed the same way: the mean as float64 sums over the tenant's nodes in
    time order (``index_put_`` accumulating), divided by the count and cast to float32;
    then the member with the least float32 squared distance to that mean, ties to the
    earliest position. All such tenants at once (segment sums over tenant codes).

    Shape: embeddings (N, D), order (N,) by (tenant, time, index), codes (N,), one (n_ten,) bool
           -> centre (n_ten,) node index (-1 for tenants not in ``one``)
    """
    dev = embeddings.device
    D = embeddings.shape[1]
    sel = order[one[codes[order]]]  # (N1,) the K = 1 tenants' nodes, by tenant then time
    c = codes[sel]
    sums = torch.zeros(n_ten, D, dtype=torch.float64, device=dev)
    tile = stream_rows(dev, D * 12, at_least=2)  # a float32 row read, a float64 row written
    for r0 in range(0, sel.shape[0], tile):
        sums.index_put_((c[r0:r0 + tile],), embeddings[sel[r0:r0 + tile]].double(), accumulate=True)
    counts = torch.bincount(c, minlength=n_ten).to(torch.float64)
    mean = (sums / counts.clamp(min=1)[:, None]).float()  # (n_ten, D)
    d = torch.empty(sel.shape[0], dtype=mean.dtype, device=dev)  # (N1,) a tile of (N1, D) at a time
    for r in row_blocks(sel.shape[0], tile):
        d[r] = ((embeddings[sel[r]].float() - mean[c[r]]) ** 2).sum(-1)
    best = torch.full((n_ten,), float("inf"), device=dev).scatter_reduce(0, c, d, "amin")
    rank = torch.arange(sel.shape[0], device=dev)  # position order inside each tenant
    big = sel.shape[0]
    first = torch.full((n_ten,), big, dtype=torch.int64, device=dev).scatter_reduce(
        0, c, torch.where(d == best[c], rank, torch.full_like(rank, big)), "amin")
    return torch.where(first < big, sel[first.clamp(max=max(big - 1, 0))], torch.full_like(first, -1))


@dataclass
class _Labels:
    """What clustering writes, tenant kind by tenant kind: each node's tree and k-means
    cluster (tenant-local ids), the centre node of every (tenant, cluster), the clusters per
    tenant, k-means iterations by bucket and the nodes moved by the reassignment."""

    tree_local: torch.Tensor  # (N,) int64
    km_local: torch.Tensor  # (N,) int64
    kmax: np.ndarray  # (n_ten,) clusters per tenant (id space of its local labels)
    # (tenant, local cluster, centre node) per clustered kind or bucket
    centres: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=list)
    iters: dict[str, int] = field(default_factory=dict)
    moved: torch.Tensor | None = None  # () int64


def partition_nodes(embeddings: torch.Tensor, timestamps: torch.Tensor, codes: torch.Tensor, names: list[str],
                    cfg: PartitionConfig, *, budget: int = 1 << 24, progress=None,
                    memory_budget: int | None = None) -> Partition:
    """Split every tenant's nodes into EventTrees.

    Tenants are handled by kind, never one by one unless they are big: a tenant whose K is 1
    is one tree with a closed-form centre (:func:`closed_form_centres`; what k-means with
    K = 1 gives, without running it); the other tenants run the batched k-means in buckets of
    similar size; tenants for two-level k-means (few, large) run one at a time. Buckets run a
    block of problems at a time, as many as fit in
    :func:`~memforest_gpu.kernels.blocks.gather_bytes` of ``memory_budget`` (bytes, the run's
    ``--memory-budget``; default: of the machine's memory); results never depend on it.

    Shape: embeddings (N, D) normalised, timestamps (N,), codes (N,) tenant code in
           [0, len(names)) -> Partition with tree (N,)
    """
    N = embeddings.shape[0]
    dev = embeddings.device
    n_ten = len(names)
    order = time_order(codes, timestamps)  # (N,) by tenant, then time: each tenant a contiguous run
    sizes_t = torch.bincount(codes, minlength=n_ten)  # (n_ten,)
    sizes = sizes_t.cpu().numpy().astype(np.int64)  # host read: the tenant sizes, once
    k_all = n_clusters(sizes, cfg.alpha)
    lab = _Labels(torch.zeros(N, dtype=torch.int64, device=dev), torch.zeros(N, dtype=torch.int64, device=dev),
                  np.ones(n_ten, dtype=np.int64), moved=torch.zeros((), dtype=torch.int64, device=dev))
    two_level = np.zeros(n_ten, dtype=bool)
    if cfg.kmeans == "two-level":
        two_level = (sizes >= cfg.two_level_min_nodes) & (k_all >= 4)
    limit = gather_bytes(dev, memory_budget)  # bytes of one gathered block of problems
    _two_level_tenants(embeddings, order, sizes, k_all, np.flatnonzero(two_level), names, cfg, (budget, limit), lab,
                       progress)
    exact = (sizes > 0) & ~two_level & (k_all >= 2)
    _exact_tenants(embeddings, order, sizes_t, sizes, k_all, exact, names, cfg, (budget, limit), lab, progress)
    one = (sizes > 0) & ~two_level & ~exact  # K = 1: one tree, closed-form centre (no k-means)
    if one.any():
        cn = closed_form_centres(embeddings, order, codes, torch.as_tensor(one, device=dev), n_ten)  # (n_ten,)
        ids = torch.as_tensor(np.flatnonzero(one), dtype=torch.int64, device=dev)
        lab.centres.append((ids, torch.zeros_like(ids), cn[ids]))
        lab.iters["K=1 closed form"] = 0
        if progress is not None:
            progress(int(sizes[one].sum()))
    return _global_trees(codes, lab, n_ten)


def _two_level_tenants(embeddings, order, sizes, k_all, tenants, names, cfg, budgets: tuple[int, int], lab: _Labels,
                       progress) -> None:
    """Two-level k-means and the reassignment, one (large) tenant at a time. ``budgets``:
    elements of a temporary, bytes of a gathered block."""
    dev = embeddings.device
    budget, limit = budgets
    starts = np.cumsum(sizes) - sizes
    for t in tenants.tolist():
        n_t = int(sizes[t])
        idx = order[starts[t]:starts[t] + n_t]  # (n_t,) node ids in time order; their vectors are never copied whole
        labels, centre, _, _, _, sem, it2 = two_level_clusters(
            embeddings, int(k_all[t]), name=names[t], seed=cfg.seed, max_iter=cfg.max_iter, budget=budget,
            seeding=cfg.seeding, rows=idx, block_bytes=limit)
        val = torch.ones(1, n_t, dtype=torch.bool, device=dev)
        new = reassign_to_centres(embeddings, val, labels[None], centre[None], beta=cfg.beta, window=cfg.window,
                                  use_semantic=cfg.use_semantic, use_temporal=cfg.use_temporal, budget=budget,
                                  semantic=(sem[0][None], sem[1][None]), rows=idx[None])[0]
        lab.moved += (new != labels).sum()
        lab.tree_local[idx] = new
        lab.km_local[idx] = labels
        lab.centres.append((torch.full_like(centre, t), torch.arange(centre.shape[0], device=dev), idx[centre]))
        lab.kmax[t] = centre.shape[0]
        lab.iters[f"two-level n={n_t}"] = it2
        if progress is not None:
            progress(n_t)


def _exact_tenants(embeddings, order, sizes_t, sizes, k_all, exact, names, cfg, budgets: tuple[int, int],
                   lab: _Labels, progress) -> None:
    """Batched k-means and the reassignment of the ``exact`` tenants, in buckets of similar size.
    ``budgets``: elements of a temporary, bytes of a gathered block."""
    dev = embeddings.device
    budget, limit = budgets
    starts_t = torch.as_tensor(np.cumsum(sizes) - sizes, dtype=torch.int64, device=dev)
    if exact.any():
        keys = torch.zeros(len(sizes), dtype=torch.int64, device=dev)
        keys[torch.as_tensor(np.flatnonzero(exact), device=dev)] = tenant_stream_keys(names, np.flatnonzero(exact), dev)
    for bucket in size_buckets(torch.as_tensor(np.where(exact, sizes, 0))):
        n_b, k_b = int(sizes[bucket.numpy()].max()), int(k_all[bucket.numpy()].max())
        # a block of the bucket's tenants at a time, padded to the bucket's nodes and clusters: the bucket's results
        # (k-means++ seeding picks its dense or sparse step by the whole batch: its buckets run whole)
        row = n_b * embeddings.shape[1] * embeddings.element_size()
        for blk in problem_blocks(len(bucket), row, limit if cfg.seeding == "batched" else 1 << 62):
            it = _exact_block(embeddings, order, starts_t, sizes_t, k_all, bucket[blk], (n_b, k_b), keys, names, cfg,
                              budget, lab)
            lab.iters[f"n<={n_b}"] = max(it, lab.iters.get(f"n<={n_b}", 0))
            if progress is not None:
                progress(int(sizes[bucket[blk].numpy()].sum()))


def _exact_block(embeddings, order, starts_t, sizes_t, k_all, bucket, pad: tuple[int, int], keys, names, cfg,
                 budget, lab: _Labels) -> int:
    """Batched k-means and the reassignment of the tenants ``bucket`` (host codes), padded to
    ``pad = (n_b, k_b)`` nodes and clusters (their bucket's); writes ``lab``. Returns the Lloyd
    iterations run."""
    dev = embeddings.device
    n_b, k_b = pad
    b_np = bucket.numpy()
    bucket = bucket.to(dev)
    idx, val = _segment_index(order, starts_t[bucket], sizes_t[bucket], n_b)  # (Tb, n)
    X = embeddings[idx.clamp(min=0)].mul_(val[:, :, None])  # (Tb, n, D)
    ks = k_all[b_np]
    k = torch.as_tensor(ks, dtype=torch.int64, device=dev)
    # k-means++ (the exact, sequential seeding) draws from one numpy generator per tenant
    u = tenant_uniforms([names[t] for t in b_np.tolist()], ks.tolist(), cfg.seed, dev) \
        if cfg.seeding == "k-means++" else None
    labels, means, c_valid, it = kmeans(X, val, k, max_iter=cfg.max_iter, seed=cfg.seed, seeding=cfg.seeding,
                                        streams=keys[bucket], uniforms=u, budget=budget, kmax=k_b)
    centre = cluster_centres(X, val, labels, means, c_valid)  # (Tb, K) column index
    new = reassign_to_centres(X, val, labels, centre, beta=cfg.beta, window=cfg.window,
                              use_semantic=cfg.use_semantic, use_temporal=cfg.use_temporal, budget=budget)
    lab.moved += ((new != labels) & val).sum()
    lab.tree_local[idx[val]] = new[val]
    lab.km_local[idx[val]] = labels[val]
    t_i, k_i = (centre >= 0).nonzero(as_tuple=True)
    lab.centres.append((bucket[t_i], k_i, idx[t_i, centre[t_i, k_i]]))
    lab.kmax[b_np] = centre.shape[1]
    return it


def _global_trees(codes: torch.Tensor, lab: _Labels, n_ten: int) -> Partition:
    """Global tree ids: (tenant, local cluster) -> consecutive ids over clusters that have
    members."""
    stride = int(lab.kmax.max()) if n_ten else 1
    gid = codes * stride + lab.tree_local  # (N,)
    gkm = codes * stride + lab.km_local
    uniq, tree = torch.unique(gid, return_inverse=True)  # sorted: tenant-major, then cluster id
    km_tree = torch.searchsorted(uniq, gkm)
    tree_tenant = uniq // stride
    centre = torch.full((uniq.shape[0],), -1, dtype=torch.int64, device=codes.device)
    if lab.centres:
        ct, ck, cn = (torch.cat(x) for x in zip(*lab.centres))
        centre[torch.searchsorted(uniq, ct * stride + ck)] = cn
    return Partition(tree, tree_tenant, centre, km_tree, lab.iters, int(lab.moved))
