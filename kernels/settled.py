"""Lloyd assignments that skip the points whose label cannot change (CPU), with the labels the
full assignment gives, bit for bit.

After an exact assignment each point keeps its score ``v`` (its own centre's, the best) and an
upper bound ``U`` on the true score of every other centre (the runner-up plus a rounding bound
``E``). Between two assignments only the centroids whose bits changed ("moved": a cluster
whose members did not change has the same float64 sums, so the same mean) can score
differently. A point is *settled* when its own centre did not move and ``U``, raised by the
moved centroids' scores from a narrow product (``+ E``), stays below ``v - TIE_EPS - 8 E``:
then any exact computation gives the same winner and no other centre within the tie rule's
``TIE_EPS`` (docs/method.md, section 1; ``E`` bounds the float32 rounding of one score,
``4 D 2^-24 (|x|^2 + |c|max^2)``, twice the classic dot-product bound). The other points are
recomputed with the full-width product over a gathered block of rows: a row's scores do not
depend on the other rows of the product, as long as the product has at least
:data:`MIN_ROWS` rows (fewer rows take another BLAS path, measured), so the block is padded
to that and today's small last tile (if any) is recomputed as it is.

The scores of settled points are left as they were (their labels are exact, their scores
within ``E``): :func:`~.lloyd.kmeans` asks for an exact assignment where it uses the scores
(re-seeding empty clusters).
"""
from __future__ import annotations

import torch

from .assign import _rows_per_tile, best_match, best_score
from .best_match_rule import TIE_EPS
from .blocks import row_blocks, stream_rows

__all__ = ["SettledRows", "MIN_ROWS", "MIN_POINTS"]

#: the fewest rows of a product whose rows get the bits they get inside a larger product
MIN_ROWS = 64
#: problems with fewer points (padded) always run the full assignment
MIN_POINTS = 512
#: a step is pruned only when at most this share of a problem's centroids moved
MOVED_SHARE = 0.25


def _sorted_first(flags: torch.Tensor, m: int) -> torch.Tensor:
    """Column indices with ``flags`` set first (in order), then the others.
    Shape: (T, n) -> (T, m)"""
    return torch.sort(flags.to(torch.uint8), dim=1, descending=True, stable=True).indices[:, :m]


class SettledRows:
    """The bounds of the last exact assignment of the active problems (see the module docstring)."""

    def __init__(self, X: torch.Tensor, valid: torch.Tensor, *, tile_elements: int):
        self.tile_elements = tile_elements
        sq = torch.empty(X.shape[:2], dtype=torch.float32, device=X.device)  # (T, n) |x|^2, a block at a time
        for cs in row_blocks(X.shape[1], stream_rows(X.device, X.shape[0] * X.shape[2] * 4, at_least=2)):
            sq[:, cs] = (X[:, cs] * X[:, cs]).sum(-1)
        self.sq = sq.double().masked_fill(~valid, 0)  # (rounded: E's factor 4 covers it)
        self.cb = self.sq.max(1).values  # (T,) a bound on |c|^2: centroids are means of points (or points)
        self.labels = self.score = self.v = self.U = None
        self.pruned = False

    @staticmethod
    def usable(X: torch.Tensor, K: int) -> bool:
        """Whether :class:`SettledRows` may serve this k-means: the torch CPU products only."""
        return X.device.type == "cpu" and X.shape[1] >= MIN_POINTS and K >= 8 and X.dtype == torch.float32

    def keep(self, sel: torch.Tensor) -> None:
        """Keep the problems ``sel`` (a boolean mask over the active ones)."""
        self.sq, self.cb = self.sq[sel], self.cb[sel]
        if self.v is not None:
            self.labels, self.score, self.v, self.U = (t[sel] for t in (self.labels, self.score, self.v, self.U))

    def _bound(self, C: torch.Tensor, c_valid: torch.Tensor) -> torch.Tensor:
        cc = (C.double() * C.double()).sum(-1).masked_fill(~c_valid, 0).max(1).values  # (T,)
        self.cb = torch.maximum(self.cb, cc)
        return 4.0 * C.shape[2] * 2.0 ** -24 * (self.sq + self.cb[:, None])  # (T, n) E

    def exact(self, X, valid, C, c_valid):
        """The full assignment (:func:`~.lloyd.lloyd_step`'s), recording the bounds."""
        E = self._bound(C, c_valid)
        s, j, r = best_match(X, C, c_valid, mode="l2", tile_elements=self.tile_elements, backend="torch", runner=True)
        self.labels, self.score = j.masked_fill(~valid, -1), s
        self.v, self.U = s.double(), r.double() + E
        self.pruned = False
        return self.labels, s

    def step(self, X, valid, C, c_valid, moved: torch.Tensor | None, n_moved: int):
        """One assignment, skipping the settled points when few centroids ``moved`` (T, K) (a
        superset of those whose bits changed; ``n_moved`` the most of one problem).
        Shape: -> labels (T, n), score (T, n)"""
        T, n, D = X.shape
        K = C.shape[1]
        if moved is None:  # the first step: its bounds would serve a pruned second step only, which follows
            self.v = None  # seeds that moved little, hardly ever; no runner-up pass
            self.pruned = False
            s, j = best_match(X, C, c_valid, mode="l2", tile_elements=self.tile_elements)  # lloyd_step's
            return j.masked_fill(~valid, -1), s
        if self.v is None or n_moved > MOVED_SHARE * K:
            return self.exact(X, valid, C, c_valid)
        E = self._bound(C, c_valid)
        U = self.U
        if n_moved:
            cols = _sorted_first(moved, n_moved)  # (T, Mv)
            ok = moved.gather(1, cols) & c_valid.gather(1, cols)
            Cm = C.gather(1, cols[:, :, None].expand(-1, -1, D))
            mx = best_score(X, Cm, ok, mode="l2", tile_elements=self.tile_elements, backend="torch")  # (T, n)
            U = torch.maximum(U, mx.double() + E)
        own_moved = moved.gather(1, self.labels.clamp(min=0))
        others = U + 8.0 * E  # (T, n) every other centre's score, bounded with the margin, must stay
        settled = (self.labels >= 0) & ~own_moved & (others < self.v - TIE_EPS)  # under the tie rule's threshold
        cand = valid & ~settled
        tile = _rows_per_tile(T, n, K, self.tile_elements)  # the full assignment's tiles
        if tile < 2 * MIN_ROWS:
            return self.exact(X, valid, C, c_valid)
        tail = _tail(n, tile)  # a small last tile is recomputed as it is
        m = int(cand[:, :tail].sum(1).max())  # host read: how many rows to recompute
        m_pad = _block_rows(m, tail)
        if m_pad is None:
            return self.exact(X, valid, C, c_valid)
        self.U = U
        if m:
            rows = _sorted_first(cand[:, :tail], m_pad)  # (T, m_pad) the candidates, then others (exact too)
            step = max(2 * MIN_ROWS, min(tile, stream_rows(X.device, T * D * 4)))  # rows gathered at a time
            for c in _chunks(m_pad, step):  # each one tile of at least MIN_ROWS rows
                self._write(rows[:, c], X.gather(1, rows[:, c, None].expand(-1, -1, D)), C, c_valid, E)
        if tail < n:
            self._write(torch.arange(tail, n, device=X.device).expand(T, -1), X[:, tail:], C, c_valid, E)
        self.labels = self.labels.masked_fill(~valid, -1)
        self.pruned = True
        return self.labels, self.score

    def _write(self, rows, Xg, C, c_valid, E) -> None:
        s, j, r = best_match(Xg, C, c_valid, mode="l2", tile_elements=self.tile_elements, backend="torch", runner=True)
        self.labels = self.labels.scatter(1, rows, j)
        self.score = self.score.scatter(1, rows, s)
        self.v = self.v.scatter(1, rows, s.double())
        self.U = self.U.scatter(1, rows, r.double() + E.gather(1, rows))



def _block_rows(m: int, tail: int) -> int | None:
    """The rows to recompute for ``m`` candidates: at least :data:`MIN_ROWS`; None when the full
    product is cheaper (over half the rows)."""
    if m == 0:
        return 0
    m_pad = max(m, MIN_ROWS)
    return m_pad if m_pad <= tail // 2 else None


def _chunks(m: int, step: int) -> list[slice]:
    """Slices of ``0..m`` (``m >= MIN_ROWS``) of ``MIN_ROWS..step`` rows (``step >= 2 MIN_ROWS``): a
    remainder under MIN_ROWS shares the last block evenly with it."""
    cuts = list(range(0, m, step)) + [m]
    if len(cuts) > 2 and cuts[-1] - cuts[-2] < MIN_ROWS:
        cuts[-2] = (cuts[-3] + cuts[-1]) // 2
    return [slice(a, b) for a, b in zip(cuts, cuts[1:])]


def _tail(n: int, tile: int) -> int:
    """Where the full product's small last tile (under :data:`MIN_ROWS` rows) starts, else ``n``."""
    last0 = ((n - 1) // tile) * tile
    return last0 if 0 < n - last0 < MIN_ROWS and last0 > 0 else n
