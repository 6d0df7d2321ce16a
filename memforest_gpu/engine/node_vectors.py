"""The vector of every node of a run, by node row: the store's rows, then the merged nodes.

Trees keep node rows, not vectors: a bucket gathers the vectors it needs when it needs them
(building its graph, re-scoring a merged node), so no padded (B, m, D) copy lives for the
run. Rows ``0..N-1`` are the store's nodes (the embeddings themselves when they are already
in the storage dtype, else one converted copy); merged nodes are appended in the order the
:class:`~memforest_gpu.engine.node_table.NodeTable` numbers them. Similarities of vectors are
accumulated in float64 (:func:`dot64`, :func:`dot64_many`, :func:`row_sims`).
"""
from __future__ import annotations

import numpy as np
import torch

from ..kernels.blocks import stream_rows
from ..store.codes import int8_codes_on

__all__ = ["NodeVectors", "HALF", "compute_dtype", "dot64", "dot64_many", "row_sims"]


HALF = (torch.float16, torch.bfloat16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of similarities for vectors stored in ``dtype``: float32 for a half storage."""
    return torch.float32 if dtype in HALF else dtype


def dot64(x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Dot products of vector pairs accumulated in float64 (the products first, then one sum
    over D, so dot(x, y) and dot(y, x) are the same bits), in the similarities' dtype of
    vectors stored in ``dtype``. Callers bound the (..., D) float64 temporary.

    Shape: x, y broadcastable (..., D) -> (...)
    """
    return (x.double() * y.double()).sum(-1).to(compute_dtype(dtype))


def dot64_many(x: torch.Tensor, Y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Dot products of each vector with its own set of vectors, accumulated in float64 by a
    batched matrix-vector product (no (..., c, D) float64 product is made), in the
    similarities' dtype. Equal to :func:`dot64` up to the float64 summation order, so the two
    agree after rounding to float32 save for values within 1e-16 of a rounding boundary.

    Shape: x (..., D), Y (..., c, D) -> (..., c)
    """
    lead = Y.shape[:-2]
    c, D = Y.shape[-2:]
    Yd = Y.reshape(-1, c, D).double()
    xd = x.expand(*lead, D).reshape(-1, D, 1).double()
    return torch.bmm(Yd, xd).view(*lead, c).to(compute_dtype(dtype))


class NodeVectors:
    """Node row -> vector, for the store's rows and the merged nodes appended after them.

    Shape: base (N, D); :meth:`gather` rows (...) -> (..., D) in the storage dtype, zeros at
           rows < 0
    """

    def __init__(self, base: torch.Tensor, dtype: torch.dtype | None = None, *, capacity: int = 0,
                 reuse: bool = False, save_codes: bool = False):
        self.dtype = dtype or base.dtype
        self.base = base if base.dtype == self.dtype else base.to(self.dtype)
        self.n_base = int(base.shape[0])
        self.reuse = reuse
        if reuse:  # see :meth:`put`
            if self.base is not base:
                raise ValueError("reuse needs the vectors in their storage dtype (the table is the caller's tensor)")
            self._pos = torch.arange(self.n_base + capacity, dtype=torch.int64, device=base.device)
            self._held = np.ones(self.n_base, dtype=bool)  # storage row still holds its own input row's vector
            self.save_codes = save_codes
            self.saved: list[tuple[np.ndarray, np.ndarray]] = []  # (input rows, their int8 codes) per put
            self._extra = torch.zeros(1, base.shape[1], dtype=self.dtype, device=base.device)
            self._n_extra = 0
            return
        # merged nodes' vectors from row 1 on (room for ``capacity`` of them, the run's merges,
        # so the table is never copied to grow); row 0 stays zero: what an empty slot (-1) reads.
        # Left uninitialised past row 0 (only written rows are ever read), so on the CPU its
        # pages become resident as merges fill them, not all at the start
        self._extra = torch.empty(1 + capacity, base.shape[1], dtype=self.dtype, device=base.device)
        self._extra[0] = 0
        self._n_extra = 0

    @property
    def dim(self) -> int:
        return int(self.base.shape[1])

    @property
    def device(self) -> torch.device:
        return self.base.device

    def append(self, rows: np.ndarray, vectors: torch.Tensor) -> torch.Tensor:
        """Store the vectors of merged nodes ``rows`` (consecutive, right after the last ones).
        Returns them in the storage dtype. ``vectors`` may be :meth:`next_rows` itself (written
        in place: nothing is copied). Shape: rows (P,) host, vectors (P, D) -> (P, D)"""
        P = len(rows)
        if P and (int(rows[0]) != self.n_base + self._n_extra or int(rows[-1]) != int(rows[0]) + P - 1):
            raise ValueError(f"rows must continue the table at {self.n_base + self._n_extra}, got "
                             f"{int(rows[0])}..{int(rows[-1])}")
        if self.reuse:
            raise ValueError("a table that reuses its rows takes merged vectors by put(rows, at, vectors)")
        dst = self.next_rows(P)
        if not (vectors.dtype == self.dtype and vectors.device == dst.device and vectors.shape == dst.shape
                and vectors.data_ptr() == dst.data_ptr()):
            dst.copy_(vectors)
        self._n_extra += P
        return dst

    def next_rows(self, P: int) -> torch.Tensor:
        """The table's rows the next ``P`` merged vectors go to (grown first if needed), for a
        caller that computes them in place; they count once :meth:`append` is called with them.
        Shape: -> (P, D), a view in the storage dtype"""
        need = 1 + self._n_extra + P
        if need > self._extra.shape[0]:  # grow by doubling: the copies cost O(merges) in all
            grown = torch.zeros(max(need, 2 * self._extra.shape[0], 1024), self.dim, dtype=self.dtype,
                                device=self.device)
            grown[: 1 + self._n_extra] = self._extra[: 1 + self._n_extra]
            self._extra = grown
        return self._extra[1 + self._n_extra:need]

    def put(self, rows: np.ndarray, at: np.ndarray, vectors: torch.Tensor) -> None:
        """Reuse mode: the merged nodes ``rows`` (consecutive, as :meth:`append`) take the
        storage rows ``at`` of the table itself, each the row of the node's earliest original
        (one of its two parents' rows: dead once they merge), so no row is added: the run's
        vectors stay the input's (N, D). With ``save_codes``, the int8 codes of input rows whose
        own vector a put overwrites are kept first (:attr:`saved`: the output's keys read them).
        Shape: rows, at (P,) host, vectors (P, D)"""
        rows, at = np.asarray(rows, dtype=np.int64), np.asarray(at, dtype=np.int64)
        P = len(rows)
        if not P:
            return
        if (int(rows[0]) != self.n_base + self._n_extra or int(rows[-1]) != int(rows[0]) + P - 1):
            raise ValueError(f"rows must continue the table at {self.n_base + self._n_extra}, got "
                             f"{int(rows[0])}..{int(rows[-1])}")
        dev = self.device
        held = at[self._held[at]]
        if self.save_codes and len(held):  # kept on the device: no host copy in a round
            self.saved.append((held, int8_codes_on(self.base.index_select(0, torch.as_tensor(held, device=dev)))))
        self._held[held] = False
        need = self.n_base + self._n_extra + P
        if need > self._pos.shape[0]:
            self._pos = torch.cat([self._pos, torch.zeros(max(need - self._pos.shape[0], self._pos.shape[0]),
                                                          dtype=torch.int64, device=dev)])
        t = torch.as_tensor(at, dtype=torch.int64, device=dev)
        self.base.index_copy_(0, t, vectors.to(device=dev, dtype=self.dtype))
        self._pos[int(rows[0]):need] = t
        self._n_extra += P

    def merged(self) -> torch.Tensor:
        """The merged nodes' vectors so far, in the storage dtype. Shape: -> (M, D), a view"""
        return self._extra[1:1 + self._n_extra]

    def dot_rows(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """:func:`dot64` of the vectors of node rows ``a`` and ``b``, a cache-sized block of
        pairs at a time (:func:`~memforest_gpu.kernels.blocks.stream_rows`).
        Shape: a, b (P,) -> (P,)"""
        out = torch.empty(a.shape[0], dtype=compute_dtype(self.dtype), device=a.device)
        step = stream_rows(a.device, self.dim * 32)  # two rows gathered, converted, multiplied
        for i in range(0, a.shape[0], step):
            out[i:i + step] = dot64(self.gather(a[i:i + step]), self.gather(b[i:i + step]), self.dtype)
        return out

    def gather(self, rows: torch.Tensor) -> torch.Tensor:
        """Vectors of node ``rows`` (zeros where a row is negative: an empty slot)."""
        flat = rows.reshape(-1)
        if self.reuse:
            out = self.base.index_select(0, self._pos[flat.clamp(min=0)])
            return out.masked_fill_((flat < 0)[:, None], 0).view(*rows.shape, self.dim)
        if self._n_extra == 0:  # no merged vector yet (the trees' layout): one gather; any other row reads zeros
            out = self.base.index_select(0, flat.clamp(min=0, max=max(self.n_base - 1, 0)))
            return out.masked_fill_(((flat < 0) | (flat >= self.n_base))[:, None], 0).view(*rows.shape, self.dim)
        stored = (flat >= 0) & (flat < self.n_base)
        out = self.base.index_select(0, flat.clamp(min=0, max=max(self.n_base - 1, 0)))
        ext = self._extra.index_select(0, torch.where(flat >= self.n_base, flat - self.n_base + 1, 0))  # 0: zeros
        return torch.where(stored[:, None], out, ext).view(*rows.shape, self.dim)


def row_sims(vectors: NodeVectors, slot: torch.Tensor, r: np.ndarray, E: torch.Tensor, *,
             pmax: int | None = None, sizes: np.ndarray | None = None) -> torch.Tensor:
    """Similarity of each new vector to every slot of its tree, accumulated in float64.

    Pairs of one tree share one gather of that tree (the matching schedule puts up to m/2
    pairs in a tree, so gathering per pair would cost O(m^2 D) memory per tree); trees are
    processed a few at a time (:func:`~memforest_gpu.kernels.blocks.stream_rows`: a
    cache-sized block on the CPU). ``r`` is a host array (the plan's host copy), so the
    grouping costs no device read.

    Shape: slot (B, m) node rows, r (P,) host row of each pair, E (P, D) new vectors, or (P,) the
           node rows of new vectors already in ``vectors`` (read a chunk at a time) -> (P, m) in
           vectors' dtype (float32 for half precision); pmax: the width of each tree's block of
           new vectors (at least the most pairs of a tree in ``r``; a caller splitting a round
           passes the round's, so the products have the same shapes whatever the split); sizes
           (B,) host: each tree's slots that can be live (:attr:`Bucket.sizes`): the products of
           a block of trees stop at its largest, the slots past it read 0 as padding does
    """
    P, D = E.shape[0], vectors.dim
    m = slot.shape[1]
    dev = slot.device
    rows, inv = np.unique(np.asarray(r, dtype=np.int64), return_inverse=True)  # (R,), (P,)
    inv = inv.reshape(-1)
    R = len(rows)
    counts = np.bincount(inv, minlength=R)
    order = np.argsort(inv, kind="stable")  # pairs grouped by tree
    start = np.cumsum(counts) - counts  # (R,) each tree's first pair in ``order``
    col = np.empty(P, dtype=np.int64)
    col[order] = np.arange(P) - start[inv[order]]
    pmax = max(int(counts.max()) if P else 0, pmax or 0)
    sizes = None if sizes is None else np.asarray(sizes)
    # with sizes, the columns past a block's largest tree stay 0: what a product with a padded slot gives
    out = (torch.empty if sizes is None else torch.zeros)(P, m, dtype=compute_dtype(vectors.dtype), device=dev)
    step = max(1, stream_rows(dev, (m + pmax) * D * 8 + m * pmax * 8))  # trees at a time
    for c0 in range(0, R, step):
        c1 = min(R, c0 + step)
        sel = order[start[c0]:start[c1 - 1] + counts[c1 - 1]]  # (Pc,) the chunk's pairs, by tree
        st = torch.as_tensor(sel, dtype=torch.int64, device=dev)
        ci = torch.as_tensor(inv[sel] - c0, dtype=torch.int64, device=dev)
        cc = torch.as_tensor(col[sel], dtype=torch.int64, device=dev)
        Ep = torch.zeros(c1 - c0, pmax, D, dtype=torch.float64, device=dev)
        Ep[ci, cc] = (vectors.gather(E[st]) if E.dim() == 1 else E[st]).double()  # (Rc, pmax, D) new vectors
        mc = m if sizes is None else int(sizes[rows[c0:c1]].max())
        trees = torch.as_tensor(rows[c0:c1], dtype=torch.int64, device=dev)
        X = vectors.gather(slot[trees, :mc]).double()  # (Rc, mc, D)
        S = torch.bmm(X, Ep.transpose(1, 2))  # (Rc, mc, pmax)
        out[st, :mc] = S[ci, :, cc].to(out.dtype)
    return out
