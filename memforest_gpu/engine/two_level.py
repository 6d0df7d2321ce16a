"""Sub-quadratic partitioning for big tenants: two-level k-means.

Exact k-means costs O(N * K * D) per Lloyd step with K = alpha * N: quadratic in N.
Two-level k-means first splits a tenant into ~sqrt(K) coarse cells (k-means trained on a
sample, then one assignment pass), gives each cell a share of the K clusters in
proportion to its size, and runs the batched k-means inside every cell at once. The
best-centre search of the reassignment step is restricted to the point's own cell (an
inverted-file search with one probe); the temporal window still sees every centre.
Cost per step: O(N * (sqrt(K) + K / sqrt(K)) * D).
"""
from __future__ import annotations

import math
import zlib

import numpy as np
import torch

from ..kernels.assign import best_match
from ..kernels.blocks import gather_bytes, problem_blocks
from ..kernels.lloyd import cluster_centres, kmeans
from ..kernels.padding import pack_segments, size_buckets
from ..kernels.rand import stream_keys
from .quotas import allocate

__all__ = ["two_level_clusters"]


def _uniforms(seed: int, name: str, salt: int, k: int) -> np.ndarray:
    return np.random.default_rng([int(seed), zlib.crc32(name.encode("utf-8")), 7919, salt]).random(k)


def _streams(name: str, salts, dev) -> torch.Tensor:
    base = zlib.crc32(name.encode("utf-8")) * 131
    return stream_keys([base + 7919 * (s + 1) for s in salts], device=dev)


def two_level_clusters(X: torch.Tensor, k: int, *, name: str, seed: int, max_iter: int,
                       sample_per_cell: int = 256, budget: int = 1 << 24, seeding: str = "batched",
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
                                          seeding=seeding, streams=_streams(name, [0], dev), uniforms=u, budget=budget)
    it_cells = 0
    cell = _coarse_cells(X, rows, cmeans, cvalid, budget)  # (n,)
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
        for blk in problem_blocks(len(bucket), nb * D * X.element_size(), limit if seeding == "batched" else 1 << 62):
            it_cells = max(it_cells, _cell_kmeans(at, index, valid, bucket[blk], (nb, kb), kc, cells, name=name,
                                                  seed=seed, max_iter=max_iter, seeding=seeding, budget=budget))
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
                 seed: int, max_iter: int, seeding: str, budget: int) -> int:
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
                                       budget=budget, kmax=kb)
    cen = cluster_centres(Xc, val, lab, means, c_valid)  # (Cb, Kb) column
    off = torch.as_tensor(out.offsets[bucket.cpu().numpy()], dtype=torch.int64, device=dev)
    out.labels[idx[val]] = (lab + off[:, None])[val]
    # the reassignment's semantic search, restricted to the point's own cell
    Cx = Xc[torch.arange(len(bucket), device=dev)[:, None], cen.clamp(min=0)]  # (Cb, Kb, D)
    s1, j1 = best_match(Xc, Cx, cen >= 0, mode="dot", budget=budget)
    out.best_cos[idx[val]] = s1[val]
    out.best_lab[idx[val]] = (j1 + off[:, None])[val]
    t_i, k_i = (cen >= 0).nonzero(as_tuple=True)
    out.centres.append(idx[t_i, cen[t_i, k_i]])
    out.keep.append(off[t_i] + k_i)
    out.centre_cells.append(bucket[t_i])
    out.means_out.append(means[t_i, k_i])
    return it_b


def _coarse_cells(X: torch.Tensor, rows: torch.Tensor | None, cmeans: torch.Tensor, cvalid: torch.Tensor,
                  budget: int) -> torch.Tensor:
    """Each point's nearest coarse centroid. With ``rows``, the points are gathered a whole
    number of :func:`best_match` tiles at a time, so every tile (and so every score) is the one
    the search over all points at once makes. Shape: -> (n,) int64"""
    if rows is None:
        return best_match(X[None], cmeans, cvalid, mode="l2", budget=budget)[1][0]
    n = rows.shape[0]
    tile = max(1, min(n, budget // max(1, cmeans.shape[1])))  # best_match's rows per tile (T = 1)
    cell = torch.empty(n, dtype=torch.int64, device=X.device)
    for r0 in range(0, n, tile):
        cell[r0:r0 + tile] = best_match(X[rows[r0:r0 + tile]][None], cmeans, cvalid, mode="l2", budget=budget)[1][0]
    return cell
