"""D^2 seeding of the batched k-means (:mod:`.kmeans`), every problem of the batch at once.

- :func:`batched_d2_seeds` (``seeding="batched"``, the default): D^2 sampling in growing
  batches (each step draws a quarter as many centres as are chosen so far, without
  replacement, in proportion to the squared distance to the centres so far), so K centres
  take O(log K) steps (28 for K = 1,000, about 50 for K = 50,000) with no device read,
  instead of K sequential steps;
- :func:`parallel_seeds` (``seeding="k-means||"``): k-means|| (Bahmani et al., 2012), a few
  oversampling rounds that each read every point once, then the seeds drawn from the
  candidates alone, weighted by the points nearest each;
- :func:`kmeans_plus_plus` (``seeding="k-means++"``): the classic one-centre-per-step
  k-means++, exact to the method's wording, K steps each reading the device a few times.
"""
from __future__ import annotations

import math

import torch

from .assign import best_match, best_score
from .rand import counter_uniform

__all__ = ["batched_d2_seeds", "parallel_seeds", "PARALLEL_ROUNDS", "PARALLEL_OVERSAMPLE", "kmeans_plus_plus",
           "kmeans_plus_plus_dense", "seeding_steps", "SEED_GROWTH"]


def _uniforms(seed: int, steps: int, T: int, device) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(int(seed))
    return torch.rand(steps, T, generator=g, dtype=torch.float64).to(device)  # (steps, T)


def _sample_step(d2, chosen, valid, sizes, u_s, active, rows):
    """One D^2-weighted draw per problem (see :func:`kmeans_plus_plus`). Shape: (T, n) -> (T,)"""
    w = d2.masked_fill(chosen, 0)
    total = w.sum(1, dtype=torch.float64)  # (T,)
    cdf = torch.cumsum(w, 1, dtype=torch.float64)  # (T, n)
    pick = torch.searchsorted(cdf, (u_s * total)[:, None], right=True)[:, 0]  # (T,)
    pick = torch.minimum(pick, (sizes - 1).clamp(min=0))
    empty = total <= 0
    if bool(empty.any()):  # degenerate: no mass left (duplicates) -> first valid, unchosen point
        pick = torch.where(empty, (valid & ~chosen).float().argmax(1), pick)
    # the cdf can land on a zero-weight point at the right edge; step back to one with mass
    bad = ~empty & (w[rows, pick] <= 0)
    if bool(bad.any()):
        pick = torch.where(bad, (w > 0).float().argmax(1), pick)
    return torch.where(active, pick, torch.full_like(pick, -1))


SEED_GROWTH = 0.25  # each seeding step draws this fraction of the centres chosen so far (1.0: doubling)


def seeding_steps(kmax: int, growth: float | None = None) -> list[int]:
    """Centres drawn per step of :func:`batched_d2_seeds`: 1, then ``ceil(growth * chosen)``
    (1, 1, 2, 4, ... for growth 1) up to ``kmax`` in all."""
    g = SEED_GROWTH if growth is None else growth
    out, total = [], 0
    while total < kmax:
        b = 1 if total == 0 else min(max(1, math.ceil(g * total)), kmax - total)
        out.append(b)
        total += b
    return out


def batched_d2_seeds(X: torch.Tensor, valid: torch.Tensor, k: torch.Tensor, *, seed: int = 0,
                     streams: torch.Tensor | None = None, tile_elements: int = 1 << 24,
                     kmax: int | None = None, weights: torch.Tensor | None = None) -> torch.Tensor:
    """D^2 seeding in growing batches, with no device read.

    Step s draws b_s new centres per problem (:func:`seeding_steps`: 1, then a quarter of
    those chosen so far; fewer once a problem has its k), without replacement, with
    probability proportional to each point's squared distance to its nearest centre so far
    (Gumbel top-b over ``log d^2``; the first centre is uniform), then updates the distances
    against the new centres in one tiled search. O(log K) steps and about one Lloyd step of
    arithmetic in all. Points that coincide with a centre (d^2 = 0) are taken only when
    nothing else is left, lowest index first. ``weights`` (T, n): each point counts that many
    times (probability proportional to ``w d^2``, the first draw to ``w``; k-means||'s
    reduction, :func:`parallel_seeds`).

    Random numbers come from :func:`counter_uniform` keyed by ``streams`` (T,) (default: the
    row index), so a problem's seeds depend only on its own points and key, on any device, and
    on ``kmax`` (default ``k.max()``): the steps' sizes, and so the products' shapes, follow it,
    so a block of a bucket's problems passes the bucket's to get the seeds the bucket gets.

    Shape: X (T, n, D), valid (T, n), k (T,) -> seeds (T, Kmax) int64 point indices (-1 = unused)
    """
    T, n, D = X.shape
    Kmax = (int(k.max()) if T else 0) if kmax is None else int(kmax)
    if Kmax == 0 or n == 0:
        return torch.full((T, Kmax), -1, dtype=torch.int64, device=X.device)
    draw = _D2Draws(X, valid, seed, streams, tile_elements, Kmax, weights)
    for b in seeding_steps(Kmax):
        draw.step(min(b, n), k - draw.count)
    return draw.seeds


class _D2Draws:
    """The state of a D^2 sampling over a batch of problems (:func:`batched_d2_seeds`,
    :func:`parallel_seeds`): the points drawn so far, in draw order, and every point's squared
    distance to the nearest of them (and, with ``nearest``, which one that is).
    Shape: seeds (T, cols) point indices (-1 = unused), d2 (T, n) float64,
           near (T, n) seed column"""

    def __init__(self, X, valid, seed: int, streams, tile_elements: int, cols: int, weights=None,
                 nearest: bool = False):
        T, n, _ = X.shape
        dev = X.device
        self.X, self.valid, self.seed, self.tile_elements, self.cols = X, valid, int(seed), tile_elements, cols
        self.streams = torch.arange(T, dtype=torch.int64, device=dev) if streams is None else streams
        self.rows = torch.arange(T, device=dev)[:, None]
        self.sq = (X.float() * X.float()).sum(-1)  # (T, n)
        self.logw = None if weights is None else torch.log(weights.double().clamp(min=1e-300))
        self.d2 = valid.to(torch.float64) if weights is None else (weights > 0).double() * valid  # uniform (by w) first
        self.chosen = torch.zeros(T, n, dtype=torch.bool, device=dev)
        self.count = torch.zeros(T, dtype=torch.int64, device=dev)
        self.seeds = torch.full((T, cols), -1, dtype=torch.int64, device=dev)
        self.near = torch.full((T, n), -1, dtype=torch.int64, device=dev) if nearest else None
        self.neg_inf = torch.tensor(float("-inf"), dtype=torch.float64, device=dev)
        # keys are distinct, so the top b are the same points in any order of search: a point
        # with mass scores log d^2 + Gumbel > -800; one without, -1e6 - its index (lower first)
        self.zero_mass = -1e6 - torch.arange(n, dtype=torch.float64, device=dev)[None, :]  # (1, n)
        self.steps = 0

    def step(self, b: int, want: torch.Tensor) -> None:
        """Draw up to ``b`` new points per problem (``want`` (T,): at most that many), then
        update the distances against them."""
        T, n = self.d2.shape
        dev = self.d2.device
        g = -torch.log(-torch.log(counter_uniform(self.seed, self.streams, self.steps, n)))  # (T, n) Gumbel
        mass = self.d2 > 0
        key = torch.log(self.d2.clamp(min=1e-300)) + g
        if self.logw is not None:
            key = key + self.logw
        key = torch.where(mass, key, self.zero_mass)
        key = torch.where(self.valid & ~self.chosen, key, self.neg_inf)
        top = torch.topk(key, b, dim=1).indices  # (T, b), by key descending
        take = torch.minimum(want, (self.valid & ~self.chosen).sum(1)).clamp(min=0, max=b)  # (T,)
        ok = torch.arange(b, device=dev)[None, :] < take[:, None]  # (T, b)
        cols = self.count[:, None] + torch.arange(b, device=dev)[None, :]
        col = torch.where(ok, cols, torch.full_like(top, self.cols))
        self.seeds = torch.cat([self.seeds, torch.full((T, 1), -1, dtype=torch.int64, device=dev)], 1).scatter(
            1, col, torch.where(ok, top, torch.full_like(top, -1)))[:, :self.cols]
        self.chosen = self.chosen | torch.zeros_like(self.chosen).scatter(1, top, ok)
        C = self.X[self.rows, top]
        if self.near is None:
            score = best_score(self.X, C, ok, mode="l2", tile_elements=self.tile_elements)  # (T, n) 2 x.c - |c|^2
        else:
            score, j = best_match(self.X, C, ok, mode="l2", tile_elements=self.tile_elements)
        nd = (self.sq - score).double().clamp(min=0)
        if self.near is not None:
            closer = (nd < self.d2) | (self.near < 0)
            self.near = torch.where(closer & (j >= 0), cols.gather(1, j.clamp(min=0)), self.near)
        self.d2 = torch.minimum(self.d2, nd) if self.steps else nd
        self.d2 = self.d2.masked_fill(self.chosen | ~self.valid, 0)
        self.count = self.count + take
        self.steps += 1


#: k-means|| (:func:`parallel_seeds`): oversampling rounds, and candidates drawn in all per centre
PARALLEL_ROUNDS = 5
PARALLEL_OVERSAMPLE = 2.0


def parallel_seeds(X: torch.Tensor, valid: torch.Tensor, k: torch.Tensor, *, seed: int = 0,
                   streams: torch.Tensor | None = None, tile_elements: int = 1 << 24, kmax: int | None = None,
                   rounds: int = PARALLEL_ROUNDS, oversample: float = PARALLEL_OVERSAMPLE) -> torch.Tensor:
    """k-means|| seeding (Bahmani et al., 2012), every problem of the batch at once.

    One point uniform, then ``rounds`` rounds that each draw ``ceil(oversample * k / rounds)``
    candidates per problem by D^2 sampling (as :func:`batched_d2_seeds` draws, without
    replacement), each round one tiled search of every point against the new candidates; each
    point counts for the candidate nearest it. The k seeds are then drawn from the candidates
    alone by weighted batched D^2 sampling (:func:`batched_d2_seeds` with those counts as
    weights). So every point is read ``rounds + 1`` times, in products as wide as the round's
    candidates, whatever k; the reduction reads only the candidates. Where the candidates would
    be as many as the points (``1 + rounds * ceil(oversample * kmax / rounds) >= n``), the seeds
    are the batched D^2 seeds (:func:`batched_d2_seeds`).

    Random numbers as :func:`batched_d2_seeds` (``streams``, ``kmax``), the reduction on
    streams of its own. Shape: X (T, n, D), valid (T, n), k (T,) -> seeds (T, Kmax) int64 point
    indices (-1 = unused)
    """
    if rounds < 1 or not oversample > 0:
        raise ValueError(f"k-means|| needs rounds >= 1 and oversample > 0, got rounds={rounds!r}, "
                         f"oversample={oversample!r}")
    T, n, D = X.shape
    dev = X.device
    Kmax = (int(k.max()) if T else 0) if kmax is None else int(kmax)
    if Kmax == 0 or n == 0:
        return torch.full((T, Kmax), -1, dtype=torch.int64, device=dev)
    per = math.ceil(oversample * Kmax / rounds)  # candidates a round draws (the widest problem's)
    if 1 + rounds * per >= n:  # as many candidates as points: the reduction is the seeding itself
        return batched_d2_seeds(X, valid, k, seed=seed, streams=streams, tile_elements=tile_elements, kmax=Kmax)
    want = torch.ceil(oversample * k.double() / rounds).long()  # (T,) a round's candidates per problem
    draw = _D2Draws(X, valid, seed, streams, tile_elements, 1 + rounds * per, nearest=True)
    draw.step(1, torch.ones_like(k))
    for _ in range(rounds):
        draw.step(per, want)
    cand = draw.seeds  # (T, C) point indices, -1 = unused
    C = cand.shape[1]
    w = torch.zeros(T, C + 1, dtype=torch.float64, device=dev)
    w.scatter_add_(1, torch.where(valid & (draw.near >= 0), draw.near, C), valid.double())
    Xc = X[draw.rows, cand.clamp(min=0)] * (cand >= 0)[..., None]  # (T, C, D)
    pick = batched_d2_seeds(Xc, cand >= 0, k, seed=seed, streams=draw.streams + 0x5EED,
                            tile_elements=tile_elements, kmax=Kmax, weights=w[:, :C])  # (T, Kmax) candidate columns
    return torch.where(pick >= 0, cand.gather(1, pick.clamp(min=0)), pick)


def kmeans_plus_plus(X: torch.Tensor, valid: torch.Tensor, k: torch.Tensor, *, seed: int = 0,
                     uniforms: torch.Tensor | None = None, dense_fraction: float = 0.35) -> torch.Tensor:
    """k-means++ seeding: first centre uniform, then D^2-weighted sampling.

    Random numbers come from a CPU generator seeded with ``seed`` so CPU and CUDA draw
    the same numbers; ``uniforms`` (Kmax, T) in [0, 1) overrides them (per-problem streams
    make a problem's result independent of what else is in the batch). When every
    remaining point coincides with a centre, the first valid point not yet chosen is taken.

    Each step only re-measures the points the new centre can win: a point whose
    nearest centre c_j satisfies |c_new - c_j| >= 2 d(x) cannot get closer (triangle
    inequality), so late steps touch a small fraction of the points. When more than
    ``dense_fraction`` of the points are candidates the step runs dense instead.
    Same seeds as :func:`kmeans_plus_plus_dense` up to float rounding.

    Shape: X (T, n, D), valid (T, n), k (T,) -> seeds (T, Kmax) int64 point indices (-1 = unused)
    """
    T, n, D = X.shape
    dev = X.device
    Kmax = int(k.max()) if T else 0
    seeds = torch.full((T, Kmax), -1, dtype=torch.int64, device=dev)
    if Kmax == 0:
        return seeds
    Xf = X.float()
    sizes = valid.sum(1)  # (T,)
    u = _uniforms(seed, Kmax, T, dev) if uniforms is None else uniforms.to(device=dev, dtype=torch.float64)
    rows = torch.arange(T, device=dev)
    first = torch.clamp((u[0] * sizes).long(), max=(sizes - 1).clamp(min=0))  # valid points are a prefix
    seeds[:, 0] = first
    sq = (Xf * Xf).sum(-1)  # (T, n)
    cent = torch.zeros(T, Kmax, D, dtype=torch.float32, device=dev)  # chosen centres so far
    cnorm = torch.zeros(T, Kmax, dtype=torch.float32, device=dev)  # their squared norms
    c = Xf[rows, first]  # (T, D)
    cent[:, 0] = c
    cnorm[:, 0] = (c * c).sum(-1)
    Xflat = Xf.reshape(T * n, D)
    d2 = (sq - 2 * torch.bmm(Xf, c[:, :, None])[:, :, 0] + (c * c).sum(-1)[:, None])
    d2 = d2.clamp(min=0).masked_fill(~valid, 0)  # (T, n) squared distance to the nearest centre
    near = torch.zeros(T, n, dtype=torch.int64, device=dev)  # which centre that is
    chosen = torch.zeros(T, n, dtype=torch.bool, device=dev)
    chosen[rows, first] = True
    d2[rows, first] = 0
    for s in range(1, Kmax):
        active = k > s  # (T,)
        pick = _sample_step(d2, chosen, valid, sizes, u[s], active, rows)
        seeds[:, s] = pick
        p = pick.clamp(min=0)
        ra = rows[active]
        chosen[ra, p[active]] = True
        c = Xf[rows, p]  # (T, D)
        cent[:, s] = c
        csq = (c * c).sum(-1)  # (T,)
        cnorm[:, s] = csq
        cc = cnorm[:, :s] - 2 * torch.bmm(cent[:, :s], c[:, :, None])[:, :, 0] + csq[:, None]  # (T, s)
        cand = valid & active[:, None] & (4.0 * d2 * (1 + 1e-5) + 1e-6 >= cc.gather(1, near))  # (T, n)
        n_cand = int(cand.sum())
        if n_cand > dense_fraction * int(valid[active].sum()):
            nd = (sq - 2 * torch.bmm(Xf, c[:, :, None])[:, :, 0] + csq[:, None]).clamp(min=0)
            win = cand & (nd < d2)
            d2 = torch.where(win, nd, d2)
            near = torch.where(win, torch.full_like(near, s), near)
        elif n_cand:
            ti, ni = cand.nonzero(as_tuple=True)
            flat = ti * n + ni
            nd = (sq.view(-1)[flat] - 2 * (Xflat.index_select(0, flat) * c[ti]).sum(-1) + csq[ti]).clamp(min=0)
            win = nd < d2[ti, ni]
            ti, ni = ti[win], ni[win]
            d2[ti, ni] = nd[win]
            near[ti, ni] = s
        d2[ra, p[active]] = 0
    return seeds


def kmeans_plus_plus_dense(X: torch.Tensor, valid: torch.Tensor, k: torch.Tensor, *, seed: int = 0,
                     uniforms: torch.Tensor | None = None) -> torch.Tensor:
    """Reference k-means++: every step updates every point's distance (O(K n D) memory
    traffic). :func:`kmeans_plus_plus` computes the same seeds with pruning.

    Random numbers come from a CPU generator seeded with ``seed`` so CPU and CUDA draw
    the same numbers; ``uniforms`` (Kmax, T) in [0, 1) overrides them (per-problem streams
    make a problem's result independent of what else is in the batch). When every remaining
    point coincides with a centre, the first valid point not yet chosen is taken.

    Shape: X (T, n, D), valid (T, n), k (T,) -> seeds (T, Kmax) int64 point indices (-1 = unused)
    """
    T, n, _ = X.shape
    dev = X.device
    Kmax = int(k.max()) if T else 0
    seeds = torch.full((T, Kmax), -1, dtype=torch.int64, device=dev)
    if Kmax == 0:
        return seeds
    sizes = valid.sum(1)  # (T,)
    u = _uniforms(seed, Kmax, T, dev) if uniforms is None else uniforms.to(device=dev, dtype=torch.float64)
    rows = torch.arange(T, device=dev)
    first = torch.clamp((u[0] * sizes).long(), max=(sizes - 1).clamp(min=0))  # valid points are a prefix
    seeds[:, 0] = first
    sq = (X.float() * X.float()).sum(-1)  # (T, n)
    c = X[rows, first]  # (T, D)
    d2 = (sq - 2 * torch.einsum("tnd,td->tn", X.float(), c.float()) + (c.float() * c.float()).sum(-1)[:, None])
    d2 = d2.clamp(min=0).masked_fill(~valid, 0).double()  # (T, n)
    chosen = torch.zeros(T, n, dtype=torch.bool, device=dev)
    chosen[rows, first] = True
    for s in range(1, Kmax):
        active = k > s  # (T,)
        w = d2.masked_fill(chosen, 0)
        total = w.sum(1)  # (T,)
        cdf = torch.cumsum(w, 1)  # (T, n)
        pick = torch.searchsorted(cdf, (u[s] * total)[:, None], right=True)[:, 0]  # (T,)
        pick = torch.minimum(pick, (sizes - 1).clamp(min=0))
        # degenerate: no mass left (duplicates) -> first valid, unchosen point
        fallback = (valid & ~chosen).float().argmax(1)
        pick = torch.where(total > 0, pick, fallback)
        # the cdf can land on a zero-weight point at the right edge; step back to one with mass
        bad = (total > 0) & (w[rows, pick] <= 0)
        if bool(bad.any()):
            pick = torch.where(bad, (w > 0).float().argmax(1), pick)
        pick = torch.where(active, pick, torch.full_like(pick, -1))
        seeds[:, s] = pick
        p = pick.clamp(min=0)
        chosen[rows[active], p[active]] = True
        c = X[rows, p].float()  # (T, D)
        nd = (sq - 2 * torch.einsum("tnd,td->tn", X.float(), c) + (c * c).sum(-1)[:, None]).clamp(min=0)
        d2 = torch.where(active[:, None], torch.minimum(d2, nd.double().masked_fill(~valid, 0)), d2)
    return seeds
