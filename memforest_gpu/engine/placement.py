"""Placing new memories into existing event trees: compact's local step (docs/method.md section 1,
applied to the nodes that arrived since a tenant's last compaction).

For every tenant of a compaction at once, trees given as global ids (``tree_start[tenant] +
local id``) with one centre row each:

1. a node's position is its rank by (timestamp, row) over all of its tenant's nodes;
2. a tree's **radius** is the least cosine of one of its members to its centre;
3. a new node **fits** tree ``t`` when ``cos(e, c_t) >= radius_t``. A node that fits some
   tree goes to the tree with the highest reassignment score
   ``u = beta * cos(e, c_t) + (1 - beta) * [|pos - pos_c| <= window]`` (the method's rule; ties
   within :data:`~memforest_gpu.kernels.reassign.TIE_TOL` to the lowest tree id: a new
   node has no k-means label to keep);
4. the nodes that fit no tree are partitioned among themselves
   (:func:`~memforest_gpu.engine.partition.partition_nodes`: K = floor(alpha m) trees of
   their own, at least one per tenant), numbered after the tenant's trees.

A tree whose centre row is gone (``-1``: its centre memory was deleted outside memforest)
gets a new one first (:func:`repair_centres`: the member nearest the tree's mean).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..config import PartitionConfig
from ..kernels.padding import pack_segments, size_buckets
from ..kernels.reassign import TIE_TOL
from .partition import partition_nodes, time_order

__all__ = ["Placement", "place_new", "positions", "tree_radius", "repair_centres"]


@dataclass
class Placement:
    """Every node's local tree; the new trees' centre rows. Shape: tree (N,) int64,
    n_trees, new_trees, placed (n_tenants,) int64; new_centres (T_new,) rows, in global
    order of the new trees (tenant-major, then local id)."""

    tree: np.ndarray
    n_trees: np.ndarray  # trees per tenant afterwards
    new_trees: np.ndarray  # trees made for the nodes that fit none
    placed: np.ndarray  # new nodes placed into existing trees
    new_centres: np.ndarray


def positions(codes: torch.Tensor, ts: torch.Tensor) -> torch.Tensor:
    """Rank of each node by (timestamp, row) inside its tenant. Shape: (N,), (N,) -> (N,)"""
    order = time_order(codes, ts)
    sizes = torch.bincount(codes)
    start = torch.cumsum(sizes, 0) - sizes
    pos = torch.empty_like(order)
    pos[order] = torch.arange(order.shape[0], device=order.device) - start[codes[order]]
    return pos


def tree_radius(emb: torch.Tensor, gtree: torch.Tensor, centre: torch.Tensor, want: torch.Tensor | None = None, *,
                chunk: int = 1 << 13) -> torch.Tensor:
    """Least cosine of a member to its tree's centre (+inf for a tree without a centre or
    members); ``want`` (T,) bool: only those trees (the others +inf), reading only their rows.
    ``chunk`` rows at a time (two gathered (chunk, D) blocks and their product: 37 MB at d = 384).
    Shape: emb (N, D), gtree (N,) global tree or -1, centre (T,) rows or -1 -> (T,)"""
    T = centre.shape[0]
    rad = torch.full((T,), float("inf"), dtype=torch.float32, device=emb.device)
    sel = gtree >= 0
    if want is not None:
        sel &= want[gtree.clamp(min=0)]
    rows = torch.nonzero(sel).flatten()
    for lo in range(0, rows.shape[0], chunk):
        r = rows[lo:lo + chunk]
        c = centre[gtree[r]]
        ok = c >= 0
        cos = (emb[r[ok]].float() * emb[c[ok]].float()).sum(-1)  # (n,)
        rad.scatter_reduce_(0, gtree[r[ok]], cos, "amin")
    return rad


def repair_centres(emb: torch.Tensor, gtree: torch.Tensor, centre: torch.Tensor) -> torch.Tensor:
    """``centre`` with each missing one (-1, for a tree that has members) replaced by the member
    nearest the tree's normalised mean (ties: lowest row). Shape: (N, D), (N,), (T,) -> (T,)"""
    lost = centre < 0
    T = centre.shape[0]
    if not bool(lost.any()):
        return centre
    rows = torch.nonzero((gtree >= 0) & lost[gtree.clamp(min=0)]).flatten()
    if rows.shape[0] == 0:
        return centre
    g = gtree[rows]
    mean = torch.zeros(T, emb.shape[1], dtype=torch.float64, device=emb.device).index_put_(
        (g,), emb[rows].double(), accumulate=True)
    mean = torch.nn.functional.normalize(mean.float(), dim=1)
    cos = (emb[rows].float() * mean[g]).sum(-1)
    best = torch.full((T,), float("-inf"), device=emb.device).scatter_reduce(0, g, cos, "amax")
    big = emb.shape[0]
    pick = torch.where(cos >= best[g] - TIE_TOL, rows, torch.full_like(rows, big))
    first = torch.full((T,), big, dtype=torch.int64, device=emb.device).scatter_reduce(0, g, pick, "amin")
    return torch.where(lost & (first < big), first, centre)


def _best_trees(X, pos_x, C, pos_c, rad, c_valid, cfg: PartitionConfig, tile_elements: int):
    """Fit and best tree of each new node of a bucket of tenants, tiled over nodes.
    Shape: X (B, m, D), pos_x (B, m), C (B, K, D), pos_c, rad, c_valid (B, K) -> fit (B, m), j
           (B, m)"""
    B, m, _ = X.shape
    K = C.shape[1]
    sem_w = cfg.beta if cfg.use_semantic else 0.0
    tmp_w = (1.0 - cfg.beta) if cfg.use_temporal else 0.0
    fit = torch.zeros(B, m, dtype=torch.bool, device=X.device)
    best = torch.zeros(B, m, dtype=torch.int64, device=X.device)
    step = max(1, min(m, tile_elements // max(1, B * K)))
    Ct = C.float().transpose(1, 2)  # (B, D, K)
    for r0 in range(0, m, step):
        s = torch.bmm(X[:, r0:r0 + step].float(), Ct)  # (B, r, K)
        fit[:, r0:r0 + step] = ((s >= rad[:, None, :] - TIE_TOL) & c_valid[:, None, :]).any(-1)
        near = (pos_x[:, r0:r0 + step, None] - pos_c[:, None, :]).abs() <= cfg.window  # (B, r, K)
        u = sem_w * s + tmp_w * near.float()
        u = u.masked_fill(~c_valid[:, None, :], float("-inf"))
        top = u.max(-1, keepdim=True).values
        best[:, r0:r0 + step] = (u >= top - TIE_TOL).to(torch.uint8).argmax(-1)  # lowest tied tree
    return fit, best


def place_new(emb: torch.Tensor, ts: torch.Tensor, codes: torch.Tensor, names: list[str], tree: np.ndarray,
              tree_start: np.ndarray, centre: torch.Tensor, cfg: PartitionConfig, *, radius: torch.Tensor | None = None,
              tile_elements: int = 1 << 24) -> Placement:
    """Place the nodes with ``tree == -1`` (see the module docstring). ``radius``: the trees'
    radii when known (a compaction keeps them with the trees), else computed here.

    Shape: emb (N, D) normalised, ts (N,), codes (N,) in [0, n_tenants), tree (N,) local ids
    or -1, tree_start (n_tenants + 1,) first global tree of each tenant, centre (T,) rows
    (every tree's centre present: call :func:`repair_centres` first), radius (T,) -> Placement
    """
    dev = emb.device
    n_ten = len(names)
    codes_np = codes.cpu().numpy()
    n_trees = np.diff(tree_start).astype(np.int64)
    tree = tree.copy()
    placed = np.zeros(n_ten, dtype=np.int64)
    new = np.flatnonzero(tree < 0)
    if len(new) == 0:
        return Placement(tree, n_trees, np.zeros(n_ten, dtype=np.int64), placed, np.zeros(0, dtype=np.int64))
    pos = positions(codes, ts)
    gtree = torch.as_tensor(np.where(tree >= 0, tree_start[codes_np] + tree, -1), dtype=torch.int64, device=dev)
    rad = radius if radius is not None else tree_radius(emb, gtree, centre)
    tree_tenant = torch.as_tensor(np.repeat(np.arange(n_ten), n_trees), dtype=torch.int64, device=dev)
    c_idx, c_ok, _ = pack_segments(tree_tenant, n_ten, max_size=int(n_trees.max()) if n_ten else 0)  # (n_ten, K)
    new_t = torch.as_tensor(new, dtype=torch.int64, device=dev)
    n_idx, n_ok, n_sizes = pack_segments(codes[new_t], n_ten)  # (n_ten, m) positions into ``new``
    fits = np.zeros(len(new), dtype=bool)
    for bucket in size_buckets(n_sizes):
        ni, nv = n_idx[bucket], n_ok[bucket]
        ni = ni[:, :int(nv.sum(1).max())]
        nv = nv[:, :ni.shape[1]]
        rows = new_t[ni.clamp(min=0)]  # (B, m) store rows
        ci, cv = c_idx[bucket], c_ok[bucket] & (centre[c_idx[bucket].clamp(min=0)] >= 0)
        crow = centre[ci.clamp(min=0)].clamp(min=0)  # (B, K)
        fit, j = _best_trees(emb[rows] * nv[..., None], pos[rows], emb[crow], pos[crow], rad[ci.clamp(min=0)], cv,
                             cfg, tile_elements)
        sel = (nv & fit).cpu().numpy()
        at = ni.cpu().numpy()[sel]
        fits[at] = True
        tree[new[at]] = j.cpu().numpy()[sel]
    np.add.at(placed, codes_np[new[fits]], 1)
    tree, new_trees, new_centres = _new_trees(emb, ts, codes_np, names, tree, new[~fits], n_trees, cfg, tile_elements)
    return Placement(tree, n_trees + new_trees, new_trees, placed, new_centres)


def _new_trees(emb, ts, codes_np, names, tree, rows: np.ndarray, n_trees, cfg, tile_elements):
    """The nodes that fit no tree, partitioned among themselves per tenant into new trees,
    numbered after each tenant's own."""
    n_ten = len(names)
    new_trees = np.zeros(n_ten, dtype=np.int64)
    if len(rows) == 0:
        return tree, new_trees, np.zeros(0, dtype=np.int64)
    dev = emb.device
    r = torch.as_tensor(rows, dtype=torch.int64, device=dev)
    ten, sub_codes = np.unique(codes_np[rows], return_inverse=True)  # tenants with misfits, in code order
    part = partition_nodes(emb[r], ts[r], torch.as_tensor(sub_codes, dtype=torch.int64, device=dev),
                           [names[t] for t in ten.tolist()], cfg, tile_elements=tile_elements)
    gt = part.tree.cpu().numpy()  # (M,) global over the misfits' trees, tenant-major
    tt = part.tree_tenant.cpu().numpy()
    first = np.searchsorted(tt, np.arange(len(ten)), side="left")
    tree[rows] = n_trees[ten[tt[gt]]] + gt - first[tt[gt]]
    new_trees[ten] = np.bincount(tt, minlength=len(ten))
    return tree, new_trees, rows[part.centre.cpu().numpy()]
