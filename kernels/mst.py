"""Maximum spanning trees of many small complete graphs at once (batched Borůvka).

Every tree of a padded batch is solved simultaneously: each Borůvka round finds, per
component, its best outgoing edge with one masked row-max over the (B, m, m) weight
matrix, then merges components with a tensor union-find (hooking + pointer jumping).
The number of rounds is fixed by m, so the kernel never synchronises with the host.
Edges are totally ordered by (weight descending, (min(i,j), max(i,j)) ascending), so
the tree is unique and equals what Kruskal (or networkx) builds under the method's tie rule.
"""
from __future__ import annotations

import torch

__all__ = ["spanning_forest", "spanning_degrees", "edge_key"]


def edge_key(u: torch.Tensor, v: torch.Tensor, m: int) -> torch.Tensor:
    """Tie key of an undirected edge: min(u,v) * m + max(u,v); smaller key wins ties."""
    return torch.minimum(u, v) * m + torch.maximum(u, v)


def spanning_forest(W: torch.Tensor, active: torch.Tensor, *, maximum: bool = True):
    """Spanning tree over the active vertices of each graph in the batch.

    Args:
        W: edge weights, exactly symmetric (the diagonal is ignored; asymmetric input can
           make components choose each other in a cycle and leave the forest incomplete).
           ``maximum=False`` builds the minimum spanning tree instead (an ablation).
        active: which vertices of each graph exist.

    Returns ``(u, v, w, valid)``: edges sorted by tie key, u < v, padded to m - 1 per graph.

    Shape: W (B, m, m), active (B, m) -> u, v (B, m-1) int64, w (B, m-1) float, valid (B, m-1) bool
    """
    B, m, _ = W.shape
    dev = W.device
    E = max(m - 1, 0)
    if B == 0 or m <= 1:
        z = torch.zeros(B, E, dtype=torch.int64, device=dev)
        return z, z.clone(), torch.zeros(B, E, dtype=W.dtype, device=dev), torch.zeros(B, E, dtype=torch.bool,
                                                                                       device=dev)
    Wd = W if maximum else -W
    neg_inf = torch.tensor(float("-inf"), dtype=W.dtype, device=dev)
    pair_ok = active[:, :, None] & active[:, None, :] & ~torch.eye(m, dtype=torch.bool, device=dev)[None]
    Wd = torch.where(pair_ok, Wd, neg_inf)  # (B, m, m)
    big = m * m
    comp = torch.arange(m, device=dev).expand(B, m).clone()  # component root per vertex
    idx = torch.arange(m, device=dev)
    brow = torch.arange(B, device=dev)[:, None]
    keys = []
    # A fixed number of Borůvka rounds and pointer-jumping passes, so the kernel never reads
    # a value back to the host (one GPU synchronisation each): components with an outgoing
    # edge at least halve every round, so ceil(log2 m) rounds join everything joinable, and
    # a parent chain is at most m long, so ceil(log2 m) + 1 jumps flatten it. Rounds past
    # that choose nothing and change nothing.
    depth = max(1, (m - 1).bit_length())
    for _round in range(depth):
        same = comp[:, :, None] == comp[:, None, :]  # (B, m, m)
        best_w, best_j = torch.where(same, neg_inf, Wd).max(dim=2)  # (B, m); lowest j among ties
        has = active & torch.isfinite(best_w)
        key = torch.where(has, edge_key(idx[None, :], best_j, m), torch.full_like(best_j, big))
        bw = torch.where(has, best_w, neg_inf)
        comp_w = torch.full((B, m), float("-inf"), dtype=W.dtype, device=dev).scatter_reduce(1, comp, bw, "amax")
        cand = has & (bw == comp_w.gather(1, comp))
        comp_key = torch.full((B, m), big, dtype=torch.int64, device=dev).scatter_reduce(
            1, comp, torch.where(cand, key, torch.full_like(key, big)), "amin")  # (B, m) per root
        chose = comp_key < big  # (B, m): root c picked edge comp_key[c]
        a = torch.where(chose, comp_key // m, 0)
        b = torch.where(chose, comp_key % m, 0)
        ca, cb = comp.gather(1, a), comp.gather(1, b)
        other = torch.where(ca == idx[None, :], cb, ca)  # the component on the far side
        parent = torch.where(chose, other, idx[None, :].expand(B, m))
        mutual = chose & (parent.gather(1, parent) == idx[None, :])
        # each edge once: a mutual pair is recorded (and rooted) by its smaller root
        record = chose & ~(mutual & (idx[None, :] > parent))
        keys.append(torch.where(record, comp_key, torch.full_like(comp_key, big)))
        parent = torch.where(mutual & (idx[None, :] < parent), idx[None, :].expand(B, m), parent)
        for _ in range(depth + 1):  # pointer jumping; depth halves each pass
            parent = parent.gather(1, parent)
        comp = parent.gather(1, comp)
    allk = torch.cat(keys, dim=1) if keys else torch.full((B, 1), big, dtype=torch.int64, device=dev)
    allk, _ = torch.sort(allk, dim=1)
    allk = allk[:, :E] if allk.shape[1] >= E else torch.cat(
        [allk, torch.full((B, E - allk.shape[1]), big, dtype=torch.int64, device=dev)], 1)
    valid = allk < big
    u = torch.where(valid, allk // m, 0)
    v = torch.where(valid, allk % m, 0)
    w = torch.where(valid, W[brow, u, v], torch.zeros((), dtype=W.dtype, device=dev))
    return u, v, w, valid


def spanning_degrees(u: torch.Tensor, v: torch.Tensor, valid: torch.Tensor, m: int) -> torch.Tensor:
    """Degree of every vertex in its spanning tree (the forest :func:`spanning_forest` returns).
    Shape: u, v, valid (B, E) -> deg (B, m) int64"""
    B = u.shape[0]
    deg = torch.zeros(B, m, dtype=torch.int64, device=u.device)
    one = valid.long()
    deg.scatter_add_(1, u, one)
    deg.scatter_add_(1, v, one)
    return deg
