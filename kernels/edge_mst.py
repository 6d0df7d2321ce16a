"""Maximum spanning forests of sparse graphs given as edge lists (batched Borůvka).

Every graph of a batch is solved at once: vertex ids are global (each graph owns a range of
them) and edges of different graphs never meet. The edges are sorted once by the method's order
(weight descending, then ``(min(u, v), max(u, v))`` ascending), so one Borůvka pass finds
each component's best outgoing edge with a single scatter-min of sorted positions; hooking
and pointer jumping join the components. A graph of m vertices is joined after
ceil(log2 m) passes (every component with an outgoing edge meets another one each pass), so
with the largest graph's size known the kernel runs that many passes, without reading the
device. On a long edge list (at least ``compact_above`` edges) the edges inside a component
are dropped after passes 2, 6, 14, ... (one host read each), so later passes only see the
edges still between components. The forest is the one Kruskal builds on the
same edge list (unique under the order above), whatever the batch.
"""
from __future__ import annotations

import torch

__all__ = ["edge_forest", "sort_edges", "float_order_key"]


def sort_edges(u: torch.Tensor, v: torch.Tensor, w: torch.Tensor, n: int, *, maximum: bool = True):
    """Edges in the method's order (docs/method.md section 2), no-edges (-inf weight, or +inf for
    ``maximum=False``, NaN, loops) last.

    Shape: u, v (E,) int64 in [0, n), w (E,) -> order (E,) int64, valid (E,) bool in that order
    """
    lo, hi = torch.minimum(u, v), torch.maximum(u, v)
    bad = float("-inf") if maximum else float("inf")
    ok = (w != bad) & ~torch.isnan(w) & (lo != hi)
    order = torch.argsort(lo * n + hi, stable=True)
    wk = torch.where(ok, w, torch.full_like(w, bad))[order]  # no-edges sort last, among themselves by pair
    order = order[torch.argsort(float_order_key(wk, descending=maximum), stable=True)]
    return order, ok[order]


def float_order_key(w: torch.Tensor, *, descending: bool = False) -> torch.Tensor:
    """Integers in the order of the floats ``w`` (no NaN), equal where the floats are equal
    (-0.0 and 0.0 too), descending or not: a stable sort of them is the stable sort of ``w``,
    and an integer sort is several times faster than a float one on a CPU (radix).
    Shape: w (E,) float32 | float64 -> (E,) int32 | int64"""
    if w.dtype not in (torch.float32, torch.float64):
        w = w.double()
    itype = torch.int32 if w.dtype == torch.float32 else torch.int64
    bits = (w + 0.0).view(itype)  # -0.0 + 0.0 is 0.0
    mag = torch.iinfo(itype).max
    key = torch.where(bits < 0, bits ^ mag, bits)  # negative floats: their magnitude's order reversed
    return ~key if descending else key


def edge_forest(u: torch.Tensor, v: torch.Tensor, w: torch.Tensor, n: int, *, maximum: bool = True,
                size: int | None = None, compact_above: int = 1 << 20, components: bool = False):
    """Maximum (``maximum=False``: minimum) spanning forest of every graph in an edge list.

    Args:
        u, v: endpoints (vertex ids global over the batch). A pair may appear several
            times (e.g. ``i -> j`` and ``j -> i`` of two neighbour lists) when every copy
            has the same weight.
        w: weights; -inf (+inf for the minimum), NaN or ``u == v`` is no edge.
        n: number of vertices.
        size: the largest graph's number of vertices (default n): bounds the passes.
        compact_above: edge lists this long drop the edges inside components as they go.

    Returns ``owner`` (n,): index into the edge list of the forest edge owned by each vertex,
    -1 for none. Each forest edge is owned by exactly one vertex (the component root that
    hooked through it), so a connected graph of c vertices has c - 1 owners. With
    ``components=True`` also each vertex's component (a vertex id of that component).

    Shape: u, v (E,) int64, w (E,) float -> owner (n,) int64 [, comp (n,) int64]
    """
    dev = u.device
    owner = torch.full((n,), -1, dtype=torch.int64, device=dev)
    if u.shape[0] == 0 or n == 0:
        return (owner, torch.arange(n, device=dev)) if components else owner
    order, ok = sort_edges(u, v, w, n, maximum=maximum)
    eu, ev = u[order], v[order]
    idx = torch.arange(n, device=dev)
    comp = idx.clone()
    size = n if size is None else max(1, min(size, n))
    jumps = max(1, (size - 1).bit_length()) + 1  # a parent chain is shorter than the graph
    depth = max(1, (size - 1).bit_length())  # passes that join every graph
    done, live = 0, None
    passes = 2 if u.shape[0] >= compact_above else depth
    while done < depth:
        if live is not None:
            sel = torch.nonzero(live).flatten()  # host read: the edges still between components
            if sel.shape[0] == 0:
                break
            order, eu, ev, ok = order[sel], eu[sel], ev[sel], ok[sel]
        E = order.shape[0]
        passes = min(passes, depth - done)
        pos = torch.arange(E, device=dev)
        for _ in range(passes):
            cu, cv = comp[eu], comp[ev]
            r = torch.where((cu != cv) & ok, pos, E)  # sorted position = rank; E: no edge, or inside a component
            best = torch.full((n,), E, dtype=torch.int64, device=dev)
            best.scatter_reduce_(0, cu, r, "amin").scatter_reduce_(0, cv, r, "amin")  # per root
            chose = best < E
            e = best.clamp(max=E - 1)
            a, b = comp[eu[e]], comp[ev[e]]
            parent = torch.where(chose, torch.where(a == idx, b, a), idx)
            mutual = chose & (parent[parent] == idx)
            stay = mutual & (idx < parent)  # of two roots that chose each other, the smaller stays
            owner = torch.where(chose & ~stay, order[e], owner)
            parent = torch.where(stay, idx, parent)
            for _ in range(jumps):
                parent = parent[parent]
            comp = parent[comp]
        done += passes
        live = (comp[eu] != comp[ev]) & ok
        passes *= 2
    return (owner, comp) if components else owner
