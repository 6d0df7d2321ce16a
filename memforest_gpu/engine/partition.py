"""EventTree partitioning (docs/method.md section 1): which tree each node belongs to.

Read top to bottom:

1. :func:`partition_nodes` (-> :class:`Partition`): k-means + semantic/temporal reassignment,
   run for all tenants at once (tenants of similar size share one padded batch; tenants with
   K = 1 take a closed form, all together; no Python loop per tenant but over the few
   two-level ones);
2. :func:`two_level_clusters`: the sub-quadratic k-means of big tenants (coarse cells, then
   the batched k-means inside every cell);
3. :func:`constrain`: who may merge at all (the keep rule and the merge groups), one
   relabelling of the partition's trees before the quotas.

Shapes: ``Partition.tree`` (N,) tree id per node, trees numbered tenant by tenant;
``tree_tenant`` (T,) sorted tenant codes; ``centre`` (T,) each tree's centre node row.
"""
from __future__ import annotations

import io
import json
import logging
import math
import zlib
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
import torch

from ..config import ConfigError, PartitionConfig
from ..kernels.assign import best_match
from ..kernels.blocks import gather_bytes, problem_blocks, row_blocks, stream_rows
from ..kernels.lloyd import cluster_centres, kmeans
from ..kernels.padding import pack_segments, size_buckets
from ..kernels.rand import stream_keys
from ..kernels.reassign import reassign_to_centres
from .quotas import allocate

__all__ = ["Partition", "partition_nodes", "time_order", "n_clusters", "tenant_uniforms", "tenant_streams",
           "tenant_stream_keys", "closed_form_centres", "two_level_clusters", "constrain", "kept_mask", "group_codes",
           "check_rules"]


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
                    cfg: PartitionConfig, *, tile_elements: int = 1 << 24, progress=None,
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
    _two_level_tenants(embeddings, order, sizes, k_all, np.flatnonzero(two_level), names, cfg, (tile_elements, limit),
                       lab, progress)
    exact = (sizes > 0) & ~two_level & (k_all >= 2)
    _exact_tenants(embeddings, order, sizes_t, sizes, k_all, exact, names, cfg, (tile_elements, limit), lab, progress)
    one = (sizes > 0) & ~two_level & ~exact  # K = 1: one tree, closed-form centre (no k-means)
    if one.any():
        cn = closed_form_centres(embeddings, order, codes, torch.as_tensor(one, device=dev), n_ten)  # (n_ten,)
        ids = torch.as_tensor(np.flatnonzero(one), dtype=torch.int64, device=dev)
        lab.centres.append((ids, torch.zeros_like(ids), cn[ids]))
        lab.iters["K=1 closed form"] = 0
        if progress is not None:
            progress(int(sizes[one].sum()))
    return _global_trees(codes, lab, n_ten)


def _two_level_tenants(embeddings, order, sizes, k_all, tenants, names, cfg, bounds: tuple[int, int], lab: _Labels,
                       progress) -> None:
    """Two-level k-means and the reassignment, one (large) tenant at a time. ``bounds``:
    elements of a temporary, bytes of a gathered block."""
    dev = embeddings.device
    tile_elements, limit = bounds
    starts = np.cumsum(sizes) - sizes
    for t in tenants.tolist():
        n_t = int(sizes[t])
        idx = order[starts[t]:starts[t] + n_t]  # (n_t,) node ids in time order; their vectors are never copied whole
        labels, centre, _, _, _, sem, it2 = two_level_clusters(
            embeddings, int(k_all[t]), name=names[t], seed=cfg.seed, max_iter=cfg.max_iter, tile_elements=tile_elements,
            seeding=cfg.seeding, rows=idx, block_bytes=limit)
        val = torch.ones(1, n_t, dtype=torch.bool, device=dev)
        new = reassign_to_centres(embeddings, val, labels[None], centre[None], beta=cfg.beta, window=cfg.window,
                                  use_semantic=cfg.use_semantic, use_temporal=cfg.use_temporal,
                                  tile_elements=tile_elements, semantic=(sem[0][None], sem[1][None]), rows=idx[None])[0]
        lab.moved += (new != labels).sum()
        lab.tree_local[idx] = new
        lab.km_local[idx] = labels
        lab.centres.append((torch.full_like(centre, t), torch.arange(centre.shape[0], device=dev), idx[centre]))
        lab.kmax[t] = centre.shape[0]
        lab.iters[f"two-level n={n_t}"] = it2
        if progress is not None:
            progress(n_t)


def _exact_tenants(embeddings, order, sizes_t, sizes, k_all, exact, names, cfg, bounds: tuple[int, int],
                   lab: _Labels, progress) -> None:
    """Batched k-means and the reassignment of the ``exact`` tenants, in buckets of similar size.
    ``bounds``: elements of a temporary, bytes of a gathered block."""
    dev = embeddings.device
    tile_elements, limit = bounds
    starts_t = torch.as_tensor(np.cumsum(sizes) - sizes, dtype=torch.int64, device=dev)
    if exact.any():
        keys = torch.zeros(len(sizes), dtype=torch.int64, device=dev)
        keys[torch.as_tensor(np.flatnonzero(exact), device=dev)] = tenant_stream_keys(names, np.flatnonzero(exact), dev)
    for bucket in size_buckets(torch.as_tensor(np.where(exact, sizes, 0))):
        n_b, k_b = int(sizes[bucket.numpy()].max()), int(k_all[bucket.numpy()].max())
        # a block of the bucket's tenants at a time, padded to the bucket's nodes and clusters: the bucket's results
        # (k-means++ seeding picks its dense or sparse step by the whole batch: its buckets run whole)
        row = n_b * embeddings.shape[1] * embeddings.element_size()
        for blk in problem_blocks(len(bucket), row, limit if cfg.seeding != "k-means++" else 1 << 62):
            it = _exact_block(embeddings, order, starts_t, sizes_t, k_all, bucket[blk], (n_b, k_b), keys, names, cfg,
                              tile_elements, lab)
            lab.iters[f"n<={n_b}"] = max(it, lab.iters.get(f"n<={n_b}", 0))
            if progress is not None:
                progress(int(sizes[bucket[blk].numpy()].sum()))


def _exact_block(embeddings, order, starts_t, sizes_t, k_all, bucket, pad: tuple[int, int], keys, names, cfg,
                 tile_elements, lab: _Labels) -> int:
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
                                        streams=keys[bucket], uniforms=u, tile_elements=tile_elements, kmax=k_b)
    centre = cluster_centres(X, val, labels, means, c_valid)  # (Tb, K) column index
    new = reassign_to_centres(X, val, labels, centre, beta=cfg.beta, window=cfg.window,
                              use_semantic=cfg.use_semantic, use_temporal=cfg.use_temporal, tile_elements=tile_elements)
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


# ------------------------------------------------------------------------------
# Sub-quadratic partitioning for big tenants: two-level k-means.
#
# Exact k-means costs O(N * K * D) per Lloyd step with K = alpha * N: quadratic in N.
# Two-level k-means first splits a tenant into ~sqrt(K) coarse cells (k-means trained on a
# sample, then one assignment pass), gives each cell a share of the K clusters in
# proportion to its size, and runs the batched k-means inside every cell at once. The
# best-centre search of the reassignment step is restricted to the point's own cell (an
# inverted-file search with one probe); the temporal window still sees every centre.
# Cost per step: O(N * (sqrt(K) + K / sqrt(K)) * D).
# ------------------------------------------------------------------------------

def _uniforms(seed: int, name: str, salt: int, k: int) -> np.ndarray:
    return np.random.default_rng([int(seed), zlib.crc32(name.encode("utf-8")), 7919, salt]).random(k)


def _streams(name: str, salts, dev) -> torch.Tensor:
    base = zlib.crc32(name.encode("utf-8")) * 131
    return stream_keys([base + 7919 * (s + 1) for s in salts], device=dev)


def two_level_clusters(X: torch.Tensor, k: int, *, name: str, seed: int, max_iter: int,
                       sample_per_cell: int = 256, tile_elements: int = 1 << 24, seeding: str = "batched",
                       rows: torch.Tensor | None = None, block_bytes: int | None = None):
    """k-means of one tenant through coarse cells.

    Returns ``labels`` (n,) cluster per point, ``centre`` (K',) point index of each
    cluster's centre node (K' <= k: clusters left empty are dropped), ``cell`` (n,) coarse
    cell per point, ``centre_cell`` (K',), ``means`` (K', D), the reassignment's semantic
    search (best cosine and cluster per point, inside its cell) and the iterations run
    (the coarse k-means plus the most any cell bucket needed).

    ``rows``: the tenant's points as rows of ``X`` (point ``i`` is ``X[rows[i]]``), so that no
    (n, D) copy of them is made: only the sample, one tile of the coarse assignment and one
    bucket of cells are gathered at a time, in blocks of cells of at most ``block_bytes``
    (default :func:`~memforest_gpu.kernels.blocks.gather_bytes`; results never depend on it).

    Shape: X (n, D) normalised, or X (N, D) with rows (n,) -> labels (n,), centre (K',), cell (n,),
           centre_cell (K',), means (K', D)
    """
    n, D = (X.shape[0], X.shape[1]) if rows is None else (rows.shape[0], X.shape[1])
    dev = X.device
    at = (lambda i: X[i]) if rows is None else (lambda i: X[rows[i]])  # noqa: E731 - point vectors
    K1 = max(1, min(n, int(math.ceil(math.sqrt(k)))))
    # 1. coarse quantizer trained on a sample (as faiss does), then every point assigned
    rng = np.random.default_rng([int(seed), zlib.crc32(name.encode("utf-8")), 104729])
    sample = torch.from_numpy(np.sort(rng.choice(n, size=min(n, sample_per_cell * K1), replace=False))).to(dev)
    u = torch.from_numpy(_uniforms(seed, name, 0, K1)[:, None]).to(dev) if seeding == "k-means++" else None
    _, cmeans, cvalid, it_coarse = kmeans(at(sample)[None], torch.ones(1, len(sample), dtype=torch.bool, device=dev),
                                          torch.tensor([K1], device=dev), max_iter=max_iter, seed=seed,
                                          seeding=seeding, streams=_streams(name, [0], dev), uniforms=u,
                                          tile_elements=tile_elements)
    it_cells = 0
    cell = _coarse_cells(X, rows, cmeans, cvalid, tile_elements)  # (n,)
    _, cell = torch.unique(cell, return_inverse=True)  # consecutive ids over non-empty cells
    n_cells = int(cell.max()) + 1
    sizes = torch.bincount(cell, minlength=n_cells)
    # 2. the K clusters shared out by cell size, at least one per cell
    kc = allocate(k - n_cells, sizes.cpu().numpy(), (sizes - 1).cpu().numpy()) + 1 if k > n_cells \
        else np.ones(n_cells, dtype=np.int64)
    index, valid, _ = pack_segments(cell, n_cells)  # (C, nc) point ids per cell
    labels = torch.full((n,), -1, dtype=torch.int64, device=dev)
    offsets = np.concatenate([[0], np.cumsum(kc)[:-1]])
    centres, centre_cells, means_out, keep = [], [], [], []
    best_cos = torch.full((n,), float("-inf"), device=dev)
    best_lab = torch.full((n,), -1, dtype=torch.int64, device=dev)
    cells = _CellRuns(labels, best_cos, best_lab, offsets, centres, keep, centre_cells, means_out)
    # k-means++ seeding picks its dense or sparse step by the whole batch: its buckets run whole
    limit = block_bytes if block_bytes is not None else gather_bytes(dev)
    for bucket in size_buckets(sizes):
        nb, kb = int(sizes[bucket].max()), int(kc[bucket.cpu().numpy()].max())
        # a block of the bucket's cells at a time, padded to the bucket's points and clusters: the bucket's results
        for blk in problem_blocks(len(bucket), nb * D * X.element_size(), limit if seeding != "k-means++" else 1 << 62):
            it_cells = max(it_cells, _cell_kmeans(at, index, valid, bucket[blk], (nb, kb), kc, cells, name=name,
                                                  seed=seed, max_iter=max_iter, seeding=seeding,
                                                  tile_elements=tile_elements))
    gid = torch.cat(keep)  # global cluster ids that have a centre
    order = torch.argsort(gid)
    gid, centre = gid[order], torch.cat(centres)[order]
    # compact ids to 0..K'-1
    remap = torch.full((int(kc.sum()),), -1, dtype=torch.int64, device=dev)
    remap[gid] = torch.arange(gid.shape[0], device=dev)
    return (remap[labels], centre, cell, torch.cat(centre_cells)[order], torch.cat(means_out)[order],
            (best_cos, remap[best_lab]), it_coarse + it_cells)


class _CellRuns:
    """What the cells' k-means write: labels and the semantic search per point, and per kept
    cluster its centre, global id, cell and mean (one list entry per block of cells)."""

    def __init__(self, labels, best_cos, best_lab, offsets, centres, keep, centre_cells, means_out):
        self.labels, self.best_cos, self.best_lab, self.offsets = labels, best_cos, best_lab, offsets
        self.centres, self.keep, self.centre_cells, self.means_out = centres, keep, centre_cells, means_out


def _cell_kmeans(at, index, valid, bucket, pad: tuple[int, int], kc: np.ndarray, out: _CellRuns, *, name: str,
                 seed: int, max_iter: int, seeding: str, tile_elements: int) -> int:
    """k-means of the cells ``bucket`` (their points gathered padded to ``pad = (nb, kb)``
    points and clusters, the whole bucket's), with each point's best centre inside its cell;
    writes ``out``. Returns the iterations run. Shape: index, valid (C, nc), bucket (Cb,) -> int"""
    dev = index.device
    nb, kb = pad
    idx, val = index[bucket][:, :nb], valid[bucket][:, :nb]
    Xc = at(idx.clamp(min=0)).mul_(val[:, :, None])  # (Cb, nb, D)
    kk = torch.as_tensor(kc[bucket.cpu().numpy()], dtype=torch.int64, device=dev)
    ub = None
    if seeding == "k-means++":
        ub = np.zeros((kb, len(bucket)))
        for j, c in enumerate(bucket.tolist()):
            ub[: kc[c], j] = _uniforms(seed, name, c + 1, int(kc[c]))
        ub = torch.from_numpy(ub).to(dev)
    lab, means, c_valid, it_b = kmeans(Xc, val, kk, max_iter=max_iter, seed=seed, seeding=seeding,
                                       streams=_streams(name, (bucket + 1).tolist(), dev), uniforms=ub,
                                       tile_elements=tile_elements, kmax=kb)
    cen = cluster_centres(Xc, val, lab, means, c_valid)  # (Cb, Kb) column
    off = torch.as_tensor(out.offsets[bucket.cpu().numpy()], dtype=torch.int64, device=dev)
    out.labels[idx[val]] = (lab + off[:, None])[val]
    # the reassignment's semantic search, restricted to the point's own cell
    Cx = Xc[torch.arange(len(bucket), device=dev)[:, None], cen.clamp(min=0)]  # (Cb, Kb, D)
    s1, j1 = best_match(Xc, Cx, cen >= 0, mode="dot", tile_elements=tile_elements)
    out.best_cos[idx[val]] = s1[val]
    out.best_lab[idx[val]] = (j1 + off[:, None])[val]
    t_i, k_i = (cen >= 0).nonzero(as_tuple=True)
    out.centres.append(idx[t_i, cen[t_i, k_i]])
    out.keep.append(off[t_i] + k_i)
    out.centre_cells.append(bucket[t_i])
    out.means_out.append(means[t_i, k_i])
    return it_b


def _coarse_cells(X: torch.Tensor, rows: torch.Tensor | None, cmeans: torch.Tensor, cvalid: torch.Tensor,
                  tile_elements: int) -> torch.Tensor:
    """Each point's nearest coarse centroid. With ``rows``, the points are gathered a whole
    number of :func:`best_match` tiles at a time, so every tile (and so every score) is the one
    the search over all points at once makes. Shape: -> (n,) int64"""
    if rows is None:
        return best_match(X[None], cmeans, cvalid, mode="l2", tile_elements=tile_elements)[1][0]
    n = rows.shape[0]
    tile = max(1, min(n, tile_elements // max(1, cmeans.shape[1])))  # best_match's rows per tile (T = 1)
    cell = torch.empty(n, dtype=torch.int64, device=X.device)
    for r0 in range(0, n, tile):
        cell[r0:r0 + tile] = best_match(X[rows[r0:r0 + tile]][None], cmeans, cvalid, mode="l2",
                                        tile_elements=tile_elements)[1][0]
    return cell


# ------------------------------------------------------------------------------
# Which nodes may merge: the keep rule and the merge groups (``MergeConfig.keep_pattern``,
# ``MergeConfig.merge_within``), applied to the partition before the quotas.
#
# - A node whose text matches ``keep_pattern`` never merges: it becomes a tree of its own
#   (one node, nothing to remove), so it reaches the output as it came in, with its own sources.
#   The ratio applies to the other nodes: a tenant loses ``round(ratio * (n_t - kept_t))``.
# - With ``merge_within``, every tree is split by group (equal timestamp, or equal value of a
#   metadata key), so two nodes of different groups are never in one tree and never merge.
#
# Both are one relabelling of the partition's trees: no later stage (quotas, trees, plans,
# merges) needs to know about them. Trees keep the tenant-major order the engine relies on.
# ------------------------------------------------------------------------------

log = logging.getLogger("memforest_gpu")


def check_rules(store, keep_pattern: str | None, merge_within: str | None) -> None:
    """Refuse a rule that selects no data, so that a typo cannot silently change a result:
    ``merge_within`` naming a metadata key no node has (the message lists the keys the nodes
    have), and ``keep_pattern`` matching every node (nothing could merge). Where only some
    nodes lack the key, a warning counts them: they form one group of their own."""
    if merge_within is not None and merge_within != "timestamp":
        absent = _metadata_values(store.columns()["metadata"], merge_within).null_count
        if absent == len(store):
            keys = _metadata_keys(store.columns()["metadata"])
            have = f"the nodes' metadata keys are {keys}" if keys else "no node has metadata"
            raise ConfigError("merge_within", f"must be 'timestamp' or a metadata key some node has, got "
                                              f"{merge_within!r}: {have}")
        if absent:
            log.warning("merge_within %r: %d of %d nodes have no value for it; they merge only among themselves",
                        merge_within, absent, len(store))
    if keep_pattern is not None:
        n = int(kept_mask(store.columns()["texts"], keep_pattern).sum())
        if n == len(store):
            raise ConfigError("keep_pattern", f"must leave some node free to merge, got {keep_pattern!r}, which "
                                              f"matches all {n} nodes (nothing could be merged)")


def _metadata_keys(meta, limit: int = 20) -> list[str]:
    """The keys of the nodes' metadata objects (the first ``limit``, sorted)."""
    keys: set[str] = set()
    for m in meta.to_pylist():
        if m:
            keys.update(json.loads(m))
    return sorted(keys)[:limit]


def constrain(part: Partition, store, keep_pattern: str | None, merge_within: str | None
              ) -> tuple[Partition, np.ndarray]:
    """The partition with kept nodes in one-node trees and every tree split by group, and the
    number of kept nodes per tenant. New trees are ordered by (old tree, group, kept node), so
    tenant-major order holds; a new tree keeps its old tree's centre when the centre is in it
    (else -1), and ``kmeans_tree`` becomes ``tree`` (the k-means labels were for the old trees).

    Shape: part.tree (N,) -> Partition with tree (N,), tree_tenant (T',); kept (n_tenants,) int64
    """
    n_ten = len(store.tenant_table)
    kept = np.zeros(n_ten, dtype=np.int64)
    if keep_pattern is None and merge_within is None:
        return part, kept
    dev = part.tree.device
    N = part.tree.shape[0]
    cols = [part.tree]
    if merge_within is not None:
        cols.append(torch.as_tensor(group_codes(store, merge_within), device=dev))
    if keep_pattern is not None:
        keep = kept_mask(store.columns()["texts"], keep_pattern)  # (N,) bool
        kept = np.bincount(store.tenant_codes_np[keep], minlength=n_ten).astype(np.int64)
        solo = np.where(keep, np.arange(1, N + 1), 0)  # kept node i is group i + 1 of its own
        cols.append(torch.as_tensor(solo, dtype=torch.int64, device=dev))
    key = torch.stack(cols, dim=1)  # (N, 2 or 3): old tree first, so trees stay tenant-major
    uniq, tree = torch.unique(key, dim=0, return_inverse=True)  # (T', c), (N,)
    old = uniq[:, 0]
    T = uniq.shape[0]
    c = part.centre[old]  # (T',) the old tree's centre node
    own = torch.full_like(c, -1)
    own[c >= 0] = tree[c[c >= 0]]  # the new tree that centre landed in
    centre = torch.where(own == torch.arange(T, device=dev), c, torch.full_like(c, -1))
    return Partition(tree, part.tree_tenant[old], centre, tree, part.iterations, part.moved), kept


def kept_mask(texts, pattern: str) -> np.ndarray:
    """Which texts match ``pattern`` (RE2, anywhere in the text), with one Arrow kernel.

    Shape: texts (N,) Arrow strings -> (N,) bool
    """

    return pc.match_substring_regex(texts, pattern).to_numpy(zero_copy_only=False).astype(bool)


def group_codes(store, key: str) -> np.ndarray:
    """A group code per node: equal codes for equal timestamps (``key="timestamp"``) or equal
    values of metadata ``key`` (nodes without it, or with null, share one code).

    Shape: -> (N,) int64
    """
    if key == "timestamp":
        return torch.unique(store.timestamps, return_inverse=True)[1].cpu().numpy()

    values = _metadata_values(store.columns()["metadata"], key)  # (N,) one Arrow type, nulls where absent
    codes = pc.dictionary_encode(values).indices.fill_null(-1)
    return codes.to_numpy(zero_copy_only=False).astype(np.int64) + 1  # null (absent) -> 0


def _metadata_values(meta, key: str):
    """Metadata ``key`` of every node, read by Arrow's JSON reader from the JSON texts at once
    (one line per node). The values must have one JSON type: strings, numbers or booleans.

    Shape: meta (N,) Arrow JSON strings -> (N,) Arrow array
    """

    meta = pc.if_else(pc.equal(pc.binary_length(meta), 0), "{}", meta.fill_null("{}")).cast(pa.large_string())
    off = np.frombuffer(meta.buffers()[1], dtype=np.int64)[meta.offset:meta.offset + len(meta) + 1]  # (N + 1,)
    data = np.frombuffer(meta.buffers()[2], dtype=np.uint8)[off[0]:off[-1]]
    lines = np.insert(data, off[1:-1] - off[0], ord("\n")).tobytes()  # json.dumps writes one line
    block = max(1 << 20, int(np.diff(off).max(initial=0)) + 2)
    for typ in (pa.int64(), pa.float64(), pa.string(), pa.bool_()):
        opts = pj.ParseOptions(explicit_schema=pa.schema([(key, typ)]), unexpected_field_behavior="ignore")
        try:
            table = pj.read_json(io.BytesIO(lines), read_options=pj.ReadOptions(block_size=block),
                                 parse_options=opts)
        except pa.ArrowInvalid:
            continue
        if table.num_rows == len(meta):
            return table.column(key).combine_chunks()
    raise ValueError(f"metadata values of merge_within={key!r} must be all strings, all numbers or all booleans "
                     "(or absent, or null), got a mix of types or nested values")
