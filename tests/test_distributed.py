"""Scale-out with torch.distributed: 2 gloo processes on CPU give the single-process result."""
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from memforest_gpu import CompressConfig, MergeConfig, PartitionConfig, compress, read_store, write_store
from memforest_gpu.distributed import WorkItem, balance, compress_distributed, partition_tenant, sharded_kmeans
from memforest_gpu.distributed.workload import cost, tenants_to_split
from memforest_gpu.engine.partition import n_clusters, partition_nodes, tenant_streams, tenant_uniforms
from memforest_gpu.kernels.lloyd import kmeans
from memforest_gpu.store.synthetic import synthetic_store

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")


def same_store(a, b):
    assert a.ids == b.ids
    assert a.texts == b.texts and a.tenants == b.tenants
    assert a.sources == b.sources and a.metadata == b.metadata
    assert torch.equal(a.timestamps.cpu(), b.timestamps.cpu())
    assert torch.equal(a.embeddings.cpu(), b.embeddings.cpu())


# --------------------------------------------------------------------------- planning (no processes)
def test_balance_is_lpt_and_deterministic():
    items = [WorkItem(f"t{i}", n) for i, n in enumerate([100, 90, 50, 50, 40, 10, 10, 5])]
    plan = balance(items, 3)
    assert sorted((it for p in plan for it in p), key=lambda it: it.tenant) == sorted(items, key=lambda it: it.tenant)
    loads = [sum(cost(it.size) for it in p) for p in plan]
    assert loads == [cost(100), cost(90), 2 * cost(50) + cost(40) + 2 * cost(10) + cost(5)]
    assert plan == balance(list(reversed(items)), 3)
    with pytest.raises(ValueError, match="world must be an integer >= 1, got 0"):
        balance(items, 0)


def test_tenants_to_split():
    sizes = {"big": 1000, "a": 100, "b": 100, "c": 10}
    assert tenants_to_split(sizes, 1, None) == []
    assert tenants_to_split(sizes, 2, None) == ["big"]
    assert tenants_to_split(sizes, 2, 50) == ["big", "a", "b"]


def _store():
    # one big tenant (split over ranks) and several small ones (whole tenants balanced)
    return synthetic_store(600, tenants=6, dim=24, seed=5, big_tenant_share=0.5)


def _worker(rank, world, init_file, out_dir):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        st = _store()
        big = st.tenant_names()[0]
        one = st.select_tenant(big)
        n = len(one)
        pcfg = PartitionConfig()
        k = n_clusters(n, pcfg.alpha)
        order = torch.argsort(one.timestamps, stable=True)
        X = one.embeddings[order]
        u = tenant_uniforms([big], [k], pcfg.seed, X.device)
        # sharded Lloyd steps == single-process k-means, label for label (both seedings)
        labels, _, _ = sharded_kmeans(X, k, stream=tenant_streams([big], X.device), seeding="k-means++",
                                      uniforms=u[:, 0], max_iter=pcfg.max_iter)
        ref, _, _, _ = kmeans(X[None], torch.ones(1, n, dtype=torch.bool), torch.tensor([k]), max_iter=pcfg.max_iter,
                              seeding="k-means++", uniforms=u)
        assert torch.equal(labels, ref[0])
        labels, _, _ = sharded_kmeans(X, k, stream=tenant_streams([big], X.device), max_iter=pcfg.max_iter)
        ref, _, _, _ = kmeans(X[None], torch.ones(1, n, dtype=torch.bool), torch.tensor([k]), max_iter=pcfg.max_iter,
                              streams=tenant_streams([big], X.device))
        assert torch.equal(labels, ref[0])
        # the trees too (same grouping; the engine renumbers trees consecutively)
        tree, _, _ = partition_tenant(one.embeddings, one.timestamps, big, pcfg)
        codes = torch.zeros(n, dtype=torch.int64)
        part = partition_nodes(one.embeddings, one.timestamps, codes, [big], pcfg)
        assert torch.equal(torch.unique(tree, return_inverse=True)[1], part.tree)
        # the whole pipeline, both schedules: output == single-process compress
        for ratio, schedule in ((0.3, "matching"), (0.5, "sequential")):
            cfg = CompressConfig(merge=MergeConfig(ratio=ratio, schedule=schedule))
            res = compress_distributed(st, cfg)
            if rank != 0:
                assert res is None  # the output is gathered on rank 0 only
                continue
            assert res.split == [big]
            assert all(p for p in res.plan)  # both ranks had work
            single = compress(st, cfg)
            same_store(res.store, single.store)
            keys = ("tenant", "nodes_in", "nodes_out", "requested", "removed", "shortfall")
            assert [{k: r[k] for k in keys} for r in res.report.tenants] == \
                [{k: r[k] for k in keys} for r in single.report.tenants]
        with open(os.path.join(out_dir, f"ok{rank}"), "w") as f:
            f.write("ok")
    finally:
        dist.destroy_process_group()


def test_two_gloo_processes_equal_single_process(tmp_path):
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    assert (tmp_path / "ok0").exists() and (tmp_path / "ok1").exists()


def test_one_rank_without_a_process_group():
    st = synthetic_store(200, tenants=4, dim=16, seed=2, big_tenant_share=0.5)
    cfg = CompressConfig(merge=MergeConfig(ratio=0.5))
    res = compress_distributed(st, cfg, split_above=50)  # split path, one rank
    assert res.split == [st.tenant_names()[0]]
    same_store(res.store, compress(st, cfg).store)


def test_torchrun_cli(tmp_path):
    st = _store()
    src, out, rep = tmp_path / "in.parquet", tmp_path / "out.parquet", tmp_path / "run.json"
    write_store(st, src)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "memforest_gpu.distributed", "compress", str(src), str(out), "--ratio", "0.5",
           "--embedder", "none", "--device", "cpu", "--report", str(rep), "--quiet"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "wrote" in p.stdout and "2 rank(s), backend gloo" in p.stdout
    single = compress(read_store(src), CompressConfig.preset("memforest")).store  # the CLI's default preset
    write_store(single, tmp_path / "single.parquet")
    got = read_store(out)
    assert got.vector_codes == "int8"  # the preset's codes, as the single run writes them
    same_store(got, read_store(tmp_path / "single.parquet"))
    report = json.loads(rep.read_text())
    assert report["split"] == [st.tenant_names()[0]] and len(report["plan"]) == 2


def test_cli_errors(tmp_path, capsys):
    from memforest_gpu.distributed.__main__ import main

    assert main(["compress", str(tmp_path / "missing.parquet"), str(tmp_path / "o.parquet"), "--device", "cpu"]) == 2
    assert "not found" in capsys.readouterr().err
    src = tmp_path / "in.parquet"
    write_store(synthetic_store(20, dim=8), src)
    assert main(["compress", str(src), str(tmp_path / "o.parquet"), "--device", "cpu", "--merger", "nope"]) == 2
    assert "merger must be one of" in capsys.readouterr().err
    assert main(["compress", str(src), str(tmp_path / "o.parquet"), "--device", "cpu",
                 "--merger-option", "oops"]) == 2
    assert "--merger-option must be KEY=VALUE, got 'oops'" in capsys.readouterr().err
    assert not (tmp_path / "o.parquet").exists()
    # without torchrun: one rank, the same output as memforest compress
    assert main(["compress", str(src), str(tmp_path / "o.parquet"), "--device", "cpu", "--embedder", "none"]) == 0
    assert "1 rank(s), backend none" in capsys.readouterr().out
    from memforest_gpu.cli.commands import main as memforest

    assert memforest(["compress", str(src), str(tmp_path / "single.parquet"), "--device", "cpu", "--embedder", "none",
                      "--quiet"]) == 0
    same_store(read_store(tmp_path / "o.parquet"), read_store(tmp_path / "single.parquet"))  # the files, read back


def test_cli_refuses_an_output_that_is_its_input(tmp_path):
    from memforest_gpu.distributed.__main__ import main
    from memforest_gpu.store.io import write_store

    src = tmp_path / "in.parquet"
    write_store(_store(), src)
    before = src.read_bytes()
    assert main(["compress", str(src), str(src), "--device", "cpu", "--embedder", "none"]) == 2
    assert src.read_bytes() == before


def test_condensed_merges_are_counted_in_the_distributed_report():
    st = synthetic_store(200, tenants=4, dim=16, seed=2, big_tenant_share=0.5)
    cfg = CompressConfig(merge=MergeConfig(ratio=0.5, max_node_tokens=12))  # cap_policy "condense"
    res = compress_distributed(st, cfg, split_above=50)
    single = compress(st, cfg)
    same_store(res.store, single.store)
    assert single.report.condensed > 0
    assert (res.report.condensed, res.report.condensed_tokens) == \
        (single.report.condensed, single.report.condensed_tokens)
