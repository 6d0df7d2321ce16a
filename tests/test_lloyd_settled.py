"""kmeans() with one host read a step and the settled-rows pruning (kernels/settled.py): the same
labels, means, valid clusters and iterations as the Lloyd loop before them (tests/lloyd_reference.py,
main at 9efd270), bit for bit, with the pruning on and off."""
from __future__ import annotations

import pytest
import torch
from host_reads import count_host_reads
from lloyd_reference import kmeans_before

import memforest_gpu.kernels.settled as settled
from memforest_gpu.kernels.assign import best_match
from memforest_gpu.kernels.lloyd import kmeans
from memforest_gpu.store.synthetic import synthetic_store


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a[:3], b[:3])) and a[3] == b[3]


@pytest.fixture
def pruned_steps(monkeypatch):
    """Counts the steps that skipped settled points."""
    seen = []
    step = settled.SettledRows.step

    def counting(self, *a, **k):
        out = step(self, *a, **k)
        seen.append(self.pruned)
        return out

    monkeypatch.setattr(settled.SettledRows, "step", counting)
    return seen


def _padded(T, n, D, K, seed):
    g = torch.Generator().manual_seed(seed)
    X = torch.nn.functional.normalize(torch.randn(T, n, D, generator=g), dim=-1)
    sizes = torch.randint(n // 2, n + 1, (T,), generator=g)
    sizes[0] = n
    valid = torch.arange(n)[None] < sizes[:, None]
    X = X * valid[:, :, None]
    X[:, 100:140] = X[:, :40]  # duplicate points: ties and empty clusters
    return X, valid, torch.clamp((sizes * K) // n, min=2)


def test_one_clustered_tenant_same_as_before(pruned_steps):
    s = synthetic_store(3000, dim=64, seed=3)
    X, v = s.embeddings[None], torch.ones(1, 3000, dtype=torch.bool)
    for streams, max_iter in ((torch.tensor([123]), 30), (torch.tensor([5]), 3)):
        ref = kmeans_before(X, v, torch.tensor([150]), streams=streams, max_iter=max_iter)
        assert _same(kmeans(X, v, torch.tensor([150]), streams=streams, max_iter=max_iter), ref)
        assert _same(kmeans(X, v, torch.tensor([150]), streams=streams, max_iter=max_iter, prune=False), ref)
    assert any(pruned_steps), pruned_steps  # the pruning did run


@pytest.mark.parametrize("T,n,D,K,kmax", [(3, 1500, 64, 60, None), (2, 2000, 32, 200, 230), (4, 700, 16, 30, None)])
def test_padded_batches_with_duplicates_same_as_before(T, n, D, K, kmax, pruned_steps):
    X, valid, k = _padded(T, n, D, K, seed=T * n)
    ref = kmeans_before(X, valid, k, streams=torch.arange(T) + 11, kmax=kmax)
    assert _same(kmeans(X, valid, k, streams=torch.arange(T) + 11, kmax=kmax), ref)
    assert any(pruned_steps), pruned_steps


@pytest.mark.parametrize("rows", [520, 130])
def test_small_tiles_and_a_small_last_tile_same_as_before(rows, pruned_steps):
    """Budgets that cut the assignment in tiles with a small last one (n % tile < MIN_ROWS), and
    (130) the recomputed rows in several gathered chunks."""
    X, valid, k = _padded(2, 1100, 32, 40, seed=5)
    tile_elements = 2 * 40 * rows  # tiles of 520 rows for T = 2: the last one has 60; of 130: the last one 60
    ref = kmeans_before(X, valid, k, streams=torch.tensor([3, 4]), tile_elements=tile_elements)
    assert _same(kmeans(X, valid, k, streams=torch.tensor([3, 4]), tile_elements=tile_elements), ref)
    assert any(pruned_steps), pruned_steps


def test_rows_of_a_product_keep_their_bits_from_min_rows_on():
    """What the pruning relies on (measured on this CPU's BLAS): a gathered block of at least
    MIN_ROWS rows gets the bits those rows get inside the whole product."""
    g = torch.Generator().manual_seed(0)
    for T, n, D, K in ((1, 4000, 384, 300), (3, 777, 64, 40), (2, 3000, 384, 13)):
        X, C, b = torch.randn(T, n, D, generator=g), torch.randn(T, K, D, generator=g), torch.randn(T, 1, K)
        full = torch.baddbmm(b, X, C.transpose(1, 2), alpha=2.0)
        for m in (settled.MIN_ROWS, settled.MIN_ROWS + 37, n // 2):
            idx = torch.randperm(n, generator=g)[:m]
            assert torch.equal(torch.baddbmm(b, X[:, idx], C.transpose(1, 2), alpha=2.0), full[:, idx])


def test_best_match_runner_up():
    g = torch.Generator().manual_seed(1)
    X, C = torch.randn(2, 300, 16, generator=g), torch.randn(2, 9, 16, generator=g)
    cv = torch.ones(2, 9, dtype=torch.bool)
    cv[1, 4:] = False
    s, j, r = best_match(X, C, cv, runner=True, tile_elements=2 * 9 * 50)
    s0, j0 = best_match(X, C, cv)
    assert torch.equal(s, s0) and torch.equal(j, j0)
    full = torch.baddbmm(-(C * C).sum(-1)[:, None, :], X, C.transpose(1, 2), alpha=2.0).masked_fill(~cv[:, None], -1e30)
    assert torch.equal(r, full.scatter(2, j[:, :, None], float("-inf")).max(2).values)
    one = best_match(X, C, cv & (torch.arange(9) == 0), runner=True)[2]
    assert torch.isinf(one).all()
    with pytest.raises(ValueError):
        best_match(X, C, cv, runner=True, backend="triton")


def test_one_host_read_a_full_step_two_a_pruned_one(pruned_steps):
    s = synthetic_store(3000, dim=64, seed=3)
    X, v = s.embeddings[None], torch.ones(1, 3000, dtype=torch.bool)
    with count_host_reads() as reads:
        _, _, _, it = kmeans(X, v, torch.tensor([150]), streams=torch.tensor([123]))
    # one read a step (the last one, that converged, too); a step after the first may read once more
    # (the rows to recompute)
    assert it < 30 and reads.by_name["Tensor.tolist"] == it, (dict(reads.by_name), it)
    extra = reads.total - it - 1  # and the seeding's one (k.max())
    assert sum(pruned_steps) <= extra <= it - 1, (dict(reads.by_name), pruned_steps)
    with count_host_reads() as reads:
        _, _, _, it = kmeans(X, v, torch.tensor([150]), streams=torch.tensor([123]), prune=False)
    assert reads.total == it + 1, dict(reads.by_name)
