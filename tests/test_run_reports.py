"""One store, three drivers (in memory, ``--memory-budget``, two gloo processes): the same report.

Each driver combines the reports of its parts (tenant groups, ranks) with
``CompressReport.combine``; what a whole run reports must not depend on how it was cut up.
"""
import json

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from llm_helpers import trivial_pair
from paper import paper_config, paper_merge

from memforest_gpu import CompressConfig, MergeConfig, PartitionConfig, compress
from memforest_gpu.api import compress_file, read_store
from memforest_gpu.cli.commands import main
from memforest_gpu.distributed import compress_distributed
from memforest_gpu.mergers import ExtractiveMerger
from memforest_gpu.mergers.llm import LLMMerger
from memforest_gpu.report import CompressReport, MergerStats, TenantRow, combine_iterations
from memforest_gpu.runs.budget_groups import node_bytes
from memforest_gpu.store.io import write_store
from memforest_gpu.store.synthetic import synthetic_store

DIM = 16
# the paper's partition (many trees: nodes moved by the reassignment), cap_policy "condense": some condensed
CONFIG = paper_config(merge=paper_merge(ratio=0.5, max_node_tokens=40))


def _store():
    """Tenants of several sizes in two size classes (k-means buckets), rows interleaved:
    360 nodes (split over ranks), 108, 108, 70, 90, 108."""
    st = synthetic_store(900, tenants=6, dim=DIM, big_tenant_share=0.4, seed=5)
    ten = np.array(st.tenants)
    rows = np.arange(len(st))
    drop = np.concatenate([rows[ten == "tenant-3"][70:], rows[ten == "tenant-4"][90:]])
    rows = np.setdiff1d(rows, drop)
    return st.take(np.random.default_rng(0).permutation(rows).tolist())


def _figures(report) -> dict:
    """The report as its JSON file holds it, seconds aside."""
    d = json.loads(json.dumps(report if isinstance(report, dict) else report.to_dict(), default=str))
    del d["seconds"]
    return d


def _worker(rank, world, init_file, src, out):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        res = compress_distributed(read_store(src), CONFIG, split_above=200)
        if rank == 0:
            assert res.split == ["tenant-0"] and all(res.plan)
            with open(out, "w") as f:
                json.dump(res.report.to_dict(), f, default=str)
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")
def test_in_memory_budgeted_and_distributed_runs_give_one_report(tmp_path):
    src = str(tmp_path / "in.parquet")
    write_store(_store(), src)
    whole = compress_file(src, str(tmp_path / "a.parquet"), CONFIG, embedder="none").report
    budget = 2 * 250 * node_bytes(DIM)  # groups of at most 250 nodes: four groups
    budgeted = compress_file(src, str(tmp_path / "b.parquet"), CONFIG, embedder="none", memory_budget=budget).report
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), src, str(tmp_path / "c.json")), nprocs=2, join=True)
    spread = json.loads((tmp_path / "c.json").read_text())

    assert whole.condensed > 0 and whole.moved_by_reassignment > 0
    assert len(whole.kmeans_iterations) >= 2  # two size classes of k-means buckets
    assert _figures(budgeted) == _figures(whole)
    assert _figures(spread) == _figures(whole)


def test_a_budgeted_run_counts_its_condensed_merges(tmp_path, capsys):
    """The default cap policy condenses merges over the node cap; a --memory-budget run says
    how many, as the in-memory run does (its report used to drop them)."""
    src = str(tmp_path / "in.parquet")
    write_store(_store(), src)
    reports, printed = [], []
    for name, extra in (("a", []), ("b", ["--memory-budget", str(2 * 250 * node_bytes(DIM))])):
        out = str(tmp_path / f"{name}.parquet")
        assert main(["compress", src, out, "--embedder", "none", "--max-node-tokens", "40", "--quiet",
                     "--report", out + ".json", *extra]) == 0
        printed.append([ln for ln in capsys.readouterr().out.splitlines() if "condensed to the cap" in ln])
        with open(out + ".json") as f:
            reports.append(json.load(f))
    a, b = reports
    assert a["condensed"] > 0 and a["condensed_tokens"] > 0
    assert (b["condensed"], b["condensed_tokens"]) == (a["condensed"], a["condensed_tokens"])
    assert len(printed[1]) == 1 and f"{a['condensed']} merges condensed to the cap" in printed[1][0]


def test_combine_adds_up_a_tenant_spread_over_parts_and_keeps_the_order():
    def part(rows, **kw):
        return CompressReport(rows, sum(r.nodes_in for r in rows), sum(r.nodes_out for r in rows),
                              sum(r.trees for r in rows), kw.pop("rounds", 1), 0, "matching", "extractive",
                              "mean-of-inputs", None, **kw)

    a = part([TenantRow.of("x", nodes_in=10, nodes_out=6, requested=5, shortfall=1, trees=2)], rounds=3,
             kmeans_iterations={"n<=100": 4, "K=1 closed form": 0}, condensed=2)
    b = part([TenantRow.of("y", nodes_in=4, nodes_out=2, requested=2, shortfall=0, trees=1),
              TenantRow.of("x", nodes_in=6, nodes_out=3, requested=3, shortfall=0, trees=1)],
             kmeans_iterations={"n<=70": 9, "n<=30": 2}, condensed=1, moved_by_reassignment=5)
    r = CompressReport.combine([a, b], order=["y", "x"])
    assert [t.tenant for t in r.tenants] == ["y", "x"]
    assert r.tenants[1] == TenantRow("x", 16, 9, 8, 7, 7 / 16, 1, 3, 0)
    assert (r.nodes_in, r.nodes_out, r.trees, r.rounds, r.condensed, r.moved_by_reassignment) == (20, 11, 4, 3, 3, 5)
    assert r.kmeans_iterations == {"n<=100": 9, "n<=30": 2, "K=1 closed form": 0}
    assert list(r.kmeans_iterations) == ["n<=100", "n<=30", "K=1 closed form"]
    assert combine_iterations([{"two-level n=900": 7}, {"n<=8": 1}]) == {"two-level n=900": 7, "n<=8": 1}
    with pytest.raises(ValueError, match="parts must hold at least one report"):
        CompressReport.combine([])
    assert CompressReport.from_dict(r.to_dict()) == r
    assert json.loads(json.dumps(r.to_dict()))["tenants"][1]["ratio"] == 7 / 16


def test_distributed_report_keeps_the_partition_figures():
    """The split tenant's k-means (all ranks together) is counted: iterations and moved nodes."""
    st = _store()
    one_tree = CompressConfig(partition=PartitionConfig(alpha=0.001), merge=CONFIG.merge)  # K = 1 for every tenant
    for cfg in (CONFIG, one_tree):
        whole = compress(st, cfg).report
        res = compress_distributed(st, cfg, split_above=200)  # one rank, the split path
        assert res.split == ["tenant-0"]
        assert _figures(res.report) == _figures(whole)
    assert whole.kmeans_iterations == {"K=1 closed form": 0}


class _Echo(LLMMerger):
    """An LLM merger whose backend answers the two texts joined (accepted) or nothing (falls back)."""

    name = "echo"

    def __init__(self, fail: bool = False):
        super().__init__()
        self.fail = fail

    def _generate(self, conversations):
        return [None if self.fail else c[1]["content"] for c in conversations]


def test_merger_stats_are_the_mergers_summary_typed():
    m = _Echo(fail=True)
    m.merge([trivial_pair()])
    st = MergerStats.of(m)
    assert st.pairs == 1 and st.fallbacks == 1 and st.failed_requests == 1 and st.replayed is None
    assert st.fallback_reasons == {"request failed": 1}
    assert st.to_dict() == m.summary() and list(st.to_dict()) == list(m.summary())
    m.stats["replayed"] = 3  # what a journaled run records
    assert MergerStats.of(m).to_dict() == m.summary() and list(MergerStats.of(m).to_dict()) == list(m.summary())
    assert MergerStats.of(m, replayed=5).replayed == 5
    assert MergerStats.of(ExtractiveMerger()) is None  # keeps no counters
