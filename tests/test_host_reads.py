"""The engine's synchronisation budget, checked on the CPU: device->host reads counted by
:func:`host_reads.count_host_reads` (tests/host_reads.py) (each one is a GPU synchronisation on CUDA).

A merge round reads the device a constant number of times, whatever the number of trees,
pairs and tenants; a whole 20,000-node compress stays under a fixed total.
"""
from __future__ import annotations

import pytest
import torch
from engine_helpers import compress_counting_reads
from host_reads import count_host_reads
from paper import paper_config, paper_merge, paper_partition

from memforest_gpu.config import CompressConfig, MergeConfig
from memforest_gpu.store.memory_store import MemoryStore
from memforest_gpu.store.synthetic import synthetic_store

ROUND_BUDGET = 10  # host reads per merge round
TOTAL_BUDGET = 300  # host reads of a whole 20,000-node compress


class Concat:
    name = "concat"

    def merge(self, pairs):
        return [f"{p.older.text} {p.newer.text}" for p in pairs]


def _store(n: int, tenants: int, dim: int = 64) -> MemoryStore:
    ids, texts, ts, ten, embs = [], [], [], [], []
    for j in range(tenants):
        s = synthetic_store(n // tenants, dim=dim, seed=j)
        ids += [f"t{j}-{i}" for i in s.ids]
        texts += s.texts
        ts += s.timestamps.tolist()
        ten += [f"t{j}"] * len(s)
        embs.append(s.embeddings)
    return MemoryStore.from_columns(ids=ids, texts=texts, timestamps=ts, embeddings=torch.cat(embs), tenants=ten)


def _reads(store, schedule):
    return compress_counting_reads(store, paper_config(merge=paper_merge(ratio=0.5, schedule=schedule)), Concat())


def test_counter_sees_the_reads_and_restores_torch():
    x = torch.arange(5)
    item = torch.Tensor.item
    with count_host_reads() as reads:
        x.sum().item()
        x.tolist()
        if (x > 2).any():
            pass
        torch.nonzero(x)
    assert reads.by_name == {"Tensor.item": 1, "Tensor.tolist": 1, "Tensor.__bool__": 1, "torch.nonzero": 1}
    assert torch.Tensor.item is item


def test_counter_sees_host_to_device_copies_apart_from_the_reads():
    """A ``meta`` tensor stands for a device one: what crosses is counted, what stays is not."""
    import numpy as np
    from host_reads import _way

    x = torch.arange(4)
    as_tensor = torch.as_tensor
    with count_host_reads() as reads:
        torch.as_tensor(np.arange(3), device="meta")
        torch.tensor([1, 2], device="meta")
        m = x.to("meta")
        x.to(m)
        torch.empty(4, device="meta").copy_(x)
        x.to(torch.float64)  # no device named: not a copy
        torch.as_tensor(np.arange(3))  # stays on the host
        torch.as_tensor(m, device="meta")  # already there
        x.to("cpu")
    assert reads.copies == {"H2D torch.as_tensor": 1, "H2D torch.tensor": 1, "H2D Tensor.to": 2, "H2D Tensor.copy_": 1}
    assert reads.h2d == 5 and reads.total == 0
    assert torch.as_tensor is as_tensor
    assert _way(torch.device("meta"), "cpu") == "D2H" and _way("cpu", "cpu") is None


@pytest.mark.parametrize("schedule", ["sequential", "matching"])
def test_reads_per_round_do_not_grow_with_trees_and_tenants(schedule):
    small, _, per_small = _reads(_store(2000, 2), schedule)  # ~100 trees, 2 tenants
    big, _, per_big = _reads(_store(20000, 20), schedule)  # ~1,000 trees, 20 tenants
    assert big.report.trees >= 9 * small.report.trees
    assert per_small and per_big
    # round 1's count includes the reads between the setup and the first round
    assert max(per_big[1:]) == max(per_small[1:]) <= ROUND_BUDGET, (per_small, per_big)


@pytest.mark.parametrize("schedule", ["sequential", "matching"])
def test_a_whole_20000_node_compress_stays_under_budget(schedule):
    res, reads, per_round = _reads(_store(20000, 2), schedule)
    assert res.report.trees >= 900 and res.report.merges == 10000
    assert reads.total <= TOTAL_BUDGET, dict(reads.by_name)
    assert max(per_round[1:]) <= ROUND_BUDGET


@pytest.mark.parametrize("schedule", ["sequential", "matching"])
def test_neighbour_lists_stay_under_budget(schedule):
    """The memforest preset's trees of 1,000 nodes keep neighbour lists (graph="knn"): the
    lists' one read per round and the flat forest keep the same budgets."""
    import dataclasses

    from memforest_gpu.config import preset

    cfg = preset("memforest")
    cfg = dataclasses.replace(cfg, merge=dataclasses.replace(cfg.merge, schedule=schedule,
                                                             ratio=0.5 if schedule == "matching" else 0.02))
    res, reads, per_round = compress_counting_reads(_store(20000, 20), cfg, Concat())
    assert res.report.trees == 20 and res.report.merges == (10000 if schedule == "matching" else 400)
    assert reads.total <= TOTAL_BUDGET, dict(reads.by_name)
    assert max(per_round[1:]) <= ROUND_BUDGET, per_round
    if schedule == "sequential":  # the plan's pairs (one copy) and the lists' stale entries: two a round
        assert max(per_round[1:]) <= 2, per_round
