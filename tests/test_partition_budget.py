"""The partition's gathered blocks follow the run's memory budget (``--memory-budget``,
``CompressConfig.memory_budget``): a tiny budget splits the buckets into more blocks and gives
the same partition, and a budgeted file run passes its budget down."""
from __future__ import annotations

import pytest
import torch

import memforest_gpu.engine.partition as part_mod
import memforest_gpu.engine.partition as two_mod
from memforest_gpu.config import CompressConfig, MergeConfig, PartitionConfig
from memforest_gpu.engine.partition import partition_nodes
from memforest_gpu.kernels.blocks import gather_bytes
from memforest_gpu.store.synthetic import synthetic_store


@pytest.fixture
def block_counts(monkeypatch):
    """How many blocks each bucket was cut into, in order."""
    seen = []
    real = part_mod.problem_blocks

    def counting(count, problem_bytes, limit):
        out = real(count, problem_bytes, limit)
        seen.append(len(out))
        return out

    monkeypatch.setattr(part_mod, "problem_blocks", counting)
    monkeypatch.setattr(two_mod, "problem_blocks", counting)
    return seen


def test_gather_bytes_is_a_share_of_the_budget():
    assert gather_bytes("cpu", 32 << 20) == 1 << 20
    assert gather_bytes("cpu", 1) == 1
    assert gather_bytes("cpu") >= 1 << 20


@pytest.mark.parametrize("kmeans", ["exact", "two-level"])
def test_a_tiny_budget_splits_the_blocks_and_keeps_the_partition(kmeans, block_counts):
    st = synthetic_store(3000, tenants=12, dim=16, seed=10)
    cfg = PartitionConfig(alpha=0.05, kmeans=kmeans, two_level_min_nodes=200)
    names, codes = st.tenant_index()
    want = partition_nodes(st.embeddings, st.timestamps, codes, names, cfg)
    whole = list(block_counts)
    block_counts.clear()
    got = partition_nodes(st.embeddings, st.timestamps, codes, names, cfg, memory_budget=64)
    assert sum(block_counts) > sum(whole), (whole, block_counts)  # one problem a block
    for f in ("tree", "tree_tenant", "centre", "kmeans_tree"):
        assert torch.equal(getattr(want, f), getattr(got, f)), f
    assert want.iterations == got.iterations and want.moved == got.moved


def test_compress_passes_the_config_budget_to_the_partition(monkeypatch):
    from memforest_gpu import compress

    seen = []
    real = part_mod.gather_bytes
    monkeypatch.setattr(part_mod, "gather_bytes", lambda dev, memory_budget=None: seen.append(memory_budget)
                        or real(dev, memory_budget))
    st = synthetic_store(800, tenants=4, dim=16, seed=3)
    base = CompressConfig(merge=MergeConfig(ratio=0.5))
    a = compress(st, base)
    b = compress(st, CompressConfig(merge=MergeConfig(ratio=0.5), memory_budget=100))
    assert seen == [None, 100]
    assert a.merges == b.merges and a.store.ids == b.store.ids
    with pytest.raises(ValueError):
        CompressConfig(memory_budget=0)


def test_a_budgeted_file_run_passes_its_budget(monkeypatch, tmp_path):
    from memforest_gpu.api import compress_file
    from memforest_gpu.store.io import write_store

    seen = []
    real = part_mod.gather_bytes
    monkeypatch.setattr(part_mod, "gather_bytes", lambda dev, memory_budget=None: seen.append(memory_budget)
                        or real(dev, memory_budget))
    src = str(tmp_path / "in.parquet")
    write_store(synthetic_store(400, tenants=2, dim=16, seed=4), src)
    compress_file(src, str(tmp_path / "out.parquet"), CompressConfig(), memory_budget=256 << 20, merger="extractive")
    assert seen and set(seen) == {256 << 20}
