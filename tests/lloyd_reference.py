"""The Lloyd loop of kernels/lloyd.py as it was before the settled-rows pruning and the one read a
step (main at 9efd270), kept verbatim as the reference the tests compare with."""
from __future__ import annotations

import torch

from memforest_gpu.kernels.blocks import row_blocks
from memforest_gpu.kernels.lloyd import LocalReduce, cluster_means, initial_centroids, lloyd_step


def kmeans_before(X, valid, k, *, max_iter=30, seed=0, seeding="batched", streams=None, uniforms=None, init=None,
                  tile_elements=1 << 24, kmax=None):
    """kmeans() of 9efd270 (single process)."""
    T, n, D = X.shape
    dev = X.device
    if init is None:
        C, c_valid = initial_centroids(X, valid, k, seeding=seeding, seed=seed, streams=streams,
                                       uniforms=uniforms, tile_elements=tile_elements, kmax=kmax)
    else:
        C, c_valid = init[0].float().clone(), init[1]
    Kmax = C.shape[1]
    red = LocalReduce(X, valid)
    rows = torch.arange(T, device=dev)
    labels = torch.full((T, n), -1, dtype=torch.int64, device=dev)
    score = torch.zeros(T, n, dtype=torch.float32, device=dev)
    act = rows
    Xa, va = X, valid
    it = 0
    for it in range(1, max_iter + 1):
        whole = act.shape[0] == T
        la, sa = lloyd_step(Xa, va, C if whole else C[act], c_valid if whole else c_valid[act],
                            tile_elements=tile_elements)
        changed = (la != labels[act]).any(1) if it > 1 else torch.ones(act.shape[0], dtype=torch.bool, device=dev)
        labels[act], score[act] = la, sa.to(score.dtype)
        if it == max_iter or not bool(changed.any()):
            break
        if not bool(changed.all()):
            act, la, sa = act[changed], la[changed], sa[changed]
            Xa, va = X[act], valid[act]
        Ca, counts = cluster_means(Xa, va, la, Kmax, reduce=red)
        empty = c_valid[act] & (counts == 0)
        if bool(empty.any()):
            sq = torch.empty(Xa.shape[:2], dtype=torch.float32, device=dev)
            for cs in row_blocks(n, tile_elements // max(1, Xa.shape[0] * D)):
                sq[:, cs] = (Xa[:, cs].float() * Xa[:, cs].float()).sum(-1)
            dist = (sq - sa).masked_fill(~va, float("-inf"))
            far = red.farthest(act, dist, int(empty.sum(1).max()))
            rank = torch.cumsum(empty.long(), 1) - 1
            sel = empty & (rank < far.shape[1])
            t_idx, k_idx = sel.nonzero(as_tuple=True)
            Ca[t_idx, k_idx] = far[t_idx, rank[t_idx, k_idx]]
        C[act] = Ca
    means, counts = cluster_means(X, valid, labels, Kmax, reduce=red)
    c_valid = c_valid & (counts > 0)
    return labels, means, c_valid, it
