"""What the run does to bound its memory changes no result: the partition's block-wise
products and row gathers, the output written into the run's own vectors, the lazy metadata
of merged nodes; each compared exactly with the plain computation."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from memforest_gpu.config import CompressConfig, MergeConfig, PartitionConfig
from memforest_gpu.engine import compress
from memforest_gpu.engine.memory import MemoryPlan
from memforest_gpu.engine.partition import two_level_clusters
from memforest_gpu.kernels.blocks import problem_blocks, row_blocks
from memforest_gpu.kernels.lloyd import cluster_centres
from memforest_gpu.kernels.reassign import reassign_to_centres
from memforest_gpu.store.memory_store import MemoryStore
from memforest_gpu.store.synthetic import synthetic_store


def _unit(n, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(n, d, generator=g), dim=1)


def test_row_blocks_cover_the_rows_without_a_lone_last_row():
    for n in range(12):
        for step in (0, 1, 2, 3, 5, 100):
            blocks = row_blocks(n, step)
            assert [i for b in blocks for i in range(b.start, b.stop)] == list(range(n))
            assert n == 1 or all(b.stop - b.start >= 2 for b in blocks)


@pytest.mark.parametrize("tile_elements", [1 << 24, 999, 40])
def test_cluster_centres_in_blocks_equal_all_at_once(tile_elements):
    X = _unit(3 * 301, 16).view(3, 301, 16)
    valid = torch.ones(3, 301, dtype=torch.bool)
    valid[2, 250:] = False
    labels = torch.randint(0, 7, (3, 301), generator=torch.Generator().manual_seed(1)).masked_fill(~valid, -1)
    means = _unit(21, 16, seed=2).view(3, 7, 16)
    c_valid = torch.ones(3, 7, dtype=torch.bool)
    want = cluster_centres(X, valid, labels, means, c_valid, tile_elements=1 << 30)
    assert torch.equal(cluster_centres(X, valid, labels, means, c_valid, tile_elements=tile_elements), want)


@pytest.mark.parametrize("tile_elements", [1 << 24, 5000, 30])
def test_reassignment_from_rows_in_blocks_equals_the_gathered_points(tile_elements):
    """Point (t, j) as embeddings[rows[t, j]], a block at a time, against the (T, n, D) copy."""
    emb = _unit(500, 24, seed=3)
    g = torch.Generator().manual_seed(4)
    rows = torch.randperm(500, generator=g)[:2 * 201].view(2, 201)  # (T, n)
    valid = torch.ones(2, 201, dtype=torch.bool)
    centre = torch.stack([torch.randperm(201, generator=g)[:9] for _ in range(2)])  # (T, K)
    labels = torch.randint(0, 9, (2, 201), generator=g)
    labels[torch.arange(2)[:, None], centre] = torch.arange(9)
    sem = (torch.rand(2, 201, generator=g), torch.randint(0, 9, (2, 201), generator=g))
    X = emb[rows]  # (T, n, D)
    want = reassign_to_centres(X, valid, labels, centre, semantic=sem, tile_elements=1 << 30)
    got = reassign_to_centres(emb, valid, labels, centre, semantic=sem, rows=rows, tile_elements=tile_elements)
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="semantic must be given with rows"):
        reassign_to_centres(emb, valid, labels, centre, rows=rows)


@pytest.mark.parametrize("tile_elements", [1 << 24, 20000])
def test_two_level_from_rows_equals_the_gathered_points(tile_elements):
    emb = _unit(3000, 16, seed=5)
    rows = torch.randperm(3000, generator=torch.Generator().manual_seed(6))[:2500]
    want = two_level_clusters(emb[rows], 100, name="t", seed=0, max_iter=10, tile_elements=tile_elements)
    got = two_level_clusters(emb, 100, name="t", seed=0, max_iter=10, tile_elements=tile_elements, rows=rows)
    for w, g in zip(want[:5], got[:5]):
        assert torch.equal(w, g)
    assert torch.equal(want[5][0], got[5][0]) and torch.equal(want[5][1], got[5][1]) and want[6] == got[6]


def _meta_store():
    st = synthetic_store(400, tenants=3, dim=16, seed=7)
    meta = [{"k": i % 3, "who": f"n{i}"} if i % 4 else {} for i in range(len(st))]
    return MemoryStore.from_columns(ids=st.ids, texts=st.texts, timestamps=st.timestamps,
                                    embeddings=st.embeddings, tenants=st.tenants, metadata=meta)


@pytest.mark.parametrize("schedule", ["sequential", "matching"])
def test_output_in_the_runs_own_vectors_is_the_same_store(schedule):
    """``MemoryPlan(overwrite_input=True)`` writes the output into the store's tensor: the same output, and merged
    nodes' metadata (made lazily from their parents) as the rule says."""
    cfg = CompressConfig(partition=PartitionConfig(alpha=0.1),
                         merge=MergeConfig(ratio=0.6, schedule=schedule))
    st = _meta_store()
    a = compress(st, cfg)
    kept = st.embeddings.clone()
    assert torch.equal(st.embeddings, kept)  # the default plan leaves the store alone
    b = compress(st, cfg, memory=MemoryPlan(overwrite_input=True))
    assert torch.equal(a.store.embeddings, b.store.embeddings)
    assert b.store.embeddings.data_ptr() == st.embeddings.data_ptr()  # a view of the store's own rows
    for col in ("ids", "texts", "sources", "metadata", "tenants"):
        assert getattr(a.store, col) == getattr(b.store, col), col
    assert torch.equal(a.store.timestamps, b.store.timestamps)
    meta = {i: m for i, m in zip(st.ids, st.metadata)}
    for r in a.merges:  # in merge order: a merged node may be merged again
        meta[r.into] = {**meta[r.a], **meta[r.b], "merged_from": [r.a, r.b]}
    assert all(m == meta[i] for i, m in zip(a.store.ids, a.store.metadata))
    assert any("merged_from" in m and len(m) > 1 for m in a.store.metadata)


def test_output_in_place_moves_rows_forward_only():
    """Every live original lands at or before its own row, so the in-place pass is safe."""
    st = synthetic_store(600, tenants=2, dim=8, seed=8)
    res = compress(st, CompressConfig(merge=MergeConfig(ratio=0.5)))
    pos = {i: p for p, i in enumerate(res.store.ids)}
    assert all(pos[i] <= r for r, i in enumerate(st.ids) if i in pos)
    assert np.all(np.diff([min(st.ids.index(s) for s in src) for src in res.store.sources]) > 0)


def test_problem_blocks_cover_the_problems():
    for count in range(7):
        for limit in (0, 1, 10, 25, 1000):
            blocks = problem_blocks(count, 10, limit)
            assert [i for b in blocks for i in range(b.start, b.stop)] == list(range(count))
            assert all(b.stop - b.start >= 1 for b in blocks)
            assert all((b.stop - b.start) * 10 <= max(limit, 10) for b in blocks)


@pytest.mark.parametrize("seeding", ["batched", "k-means||", "k-means++"])
def test_two_level_in_blocks_of_cells_equals_the_whole_bucket(seeding):
    """The cells of a bucket run a block at a time (down to one cell a block): the same labels,
    centres, means, semantic search and iterations as the whole bucket at once."""
    emb = _unit(4000, 16, seed=9)
    want = two_level_clusters(emb, 160, name="t", seed=0, max_iter=10, seeding=seeding, block_bytes=1 << 40)
    for limit in (1, 3 * 64 * 16 * 4):
        got = two_level_clusters(emb, 160, name="t", seed=0, max_iter=10, seeding=seeding, block_bytes=limit)
        for w, g in zip(want[:5], got[:5]):
            assert torch.equal(w, g)
        assert torch.equal(want[5][0], got[5][0]) and torch.equal(want[5][1], got[5][1]) and want[6] == got[6]


@pytest.mark.parametrize("kmeans", ["exact", "two-level"])
def test_partition_in_blocks_of_tenants_equals_the_whole_bucket(monkeypatch, kmeans):
    """Many tenants of similar size (one bucket) clustered a few tenants at a time: the same trees."""
    import memforest_gpu.engine.partition as part_mod
    import memforest_gpu.engine.partition as two_mod
    from memforest_gpu.engine.partition import partition_nodes

    st = synthetic_store(3000, tenants=12, dim=16, seed=10)
    cfg = PartitionConfig(alpha=0.05, kmeans=kmeans, two_level_min_nodes=200)
    names, codes = st.tenant_index()
    want = partition_nodes(st.embeddings, st.timestamps, codes, names, cfg)
    monkeypatch.setattr(part_mod, "gather_bytes", lambda dev, memory_budget=None: 1)
    monkeypatch.setattr(two_mod, "gather_bytes", lambda dev, memory_budget=None: 1)
    got = partition_nodes(st.embeddings, st.timestamps, codes, names, cfg)
    for f in ("tree", "tree_tenant", "centre", "kmeans_tree"):
        assert torch.equal(getattr(want, f), getattr(got, f)), f
    assert want.iterations == got.iterations and want.moved == got.moved


def _keyed_output():
    """A compressed store with keys, event trees and merged rows."""
    cfg = CompressConfig(partition=PartitionConfig(alpha=0.1), merge=MergeConfig(ratio=0.5, keys=-1))
    return compress(_meta_store(), cfg).store


@pytest.mark.parametrize("codes", ["float32", "int8"])
def test_parquet_written_a_row_group_at_a_time_is_the_same_file(tmp_path, monkeypatch, codes):
    """The streaming writer makes the bytes of one table written whole, row group by row group."""
    import io

    import memforest_gpu.store.parquet as pq_mod
    from memforest_gpu.store.io import read_store, write_store

    out = _keyed_output()
    out.vector_codes = codes
    assert out.keys is not None and out.event_trees is not None
    monkeypatch.setattr(pq_mod, "ROW_GROUP_ROWS", 37)  # several row groups, a short last one
    whole = io.BytesIO()
    pq_mod.write_parquet(pq_mod.to_arrow_table(out), whole)
    path = tmp_path / "out.parquet"
    write_store(out, path)
    assert path.read_bytes() == whole.getvalue()
    import pyarrow.parquet as pq

    assert pq.ParquetFile(path).metadata.num_row_groups == -(-len(out) // 37)
    back = read_store(path)
    assert back.ids == out.ids and back.sources == out.sources and back.keys is not None
