"""`memforest compress --memory-budget`: tenant groups one at a time, the in-memory run's output."""
from __future__ import annotations

import json
import logging
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from memforest_gpu.cli.commands import main
from memforest_gpu.runs.budget_groups import (
    PARTS_SUFFIX,
    group_capacity,
    node_bytes,
    output_batch_rows,
    pack_groups,
)
from memforest_gpu.sizes import parse_size
from memforest_gpu.store.io import write_store
from memforest_gpu.store.synthetic import heavy_tailed_sizes, synthetic_store, write_synthetic_parquet

DIM = 16
N = 600


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """A 600-node, 8-tenant store with its tenants' rows interleaved (not sorted by tenant),
    as Parquet and JSONL."""
    d = tmp_path_factory.mktemp("budget")
    st = synthetic_store(N, tenants=8, dim=DIM, big_tenant_share=0.3, seed=5)
    st = st.take(np.random.default_rng(0).permutation(N).tolist())
    paths = {}
    for fmt in ("parquet", "jsonl"):
        paths[fmt] = str(d / f"in.{fmt}")
        write_store(st, paths[fmt])
    return paths


def _budget_for(nodes: int) -> int:
    """A budget whose group capacity holds ``nodes`` nodes (tiny budgets: capacity = budget / 2)."""
    b = 2 * nodes * node_bytes(DIM)
    assert group_capacity(b) == b // 2
    return b


def _run(src, out, *extra):
    args = ["compress", src, out, "--embedder", "none", "--report", out + ".report.json", *extra]
    rc = main(args)
    with open(out + ".report.json") as f:
        return rc, json.load(f)


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
@pytest.mark.parametrize("schedule", ["sequential", "matching"])
def test_budgeted_output_is_the_in_memory_output(stores, tmp_path, fmt, schedule, capsys):
    src = stores[fmt]
    budget = _budget_for(300)  # groups of at most 300 nodes: several groups
    assert output_batch_rows(budget, DIM) >= N // 2  # the whole output in one batch: one row group, as in memory
    rc_a, rep_a = _run(src, str(tmp_path / f"a.{fmt}"), "--schedule", schedule)
    rc_b, rep_b = _run(src, str(tmp_path / f"b.{fmt}"), "--schedule", schedule, "--memory-budget", str(budget))
    assert rc_a == rc_b == 0
    err = capsys.readouterr().err
    assert "group 3/" in err  # at least three groups, progress per group
    with open(tmp_path / f"a.{fmt}", "rb") as f, open(tmp_path / f"b.{fmt}", "rb") as g:
        assert f.read() == g.read()
    assert rep_a["tenants"] == rep_b["tenants"]
    for k in ("nodes_in", "nodes_out", "merges", "trees", "shortfall", "embedder", "merger", "schedule"):
        assert rep_a[k] == rep_b[k], k
    assert not os.path.exists(str(tmp_path / f"b.{fmt}") + PARTS_SUFFIX)  # parts cleaned up
    assert not os.path.exists(str(tmp_path / f"b.{fmt}") + ".journal.jsonl")


def test_budgeted_run_with_a_keep_rule_is_the_in_memory_run(stores, tmp_path):
    """Kept nodes (--keep-pattern) and their per-tenant counts come out of a budgeted run as in memory."""
    src, budget = stores["parquet"], _budget_for(300)
    rc_a, rep_a = _run(src, str(tmp_path / "a.parquet"), "--keep-pattern", "^Alice")
    rc_b, rep_b = _run(src, str(tmp_path / "b.parquet"), "--keep-pattern", "^Alice", "--memory-budget", str(budget))
    assert rc_a == rc_b == 0
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    assert rep_a["tenants"] == rep_b["tenants"] and rep_a["kept"] == rep_b["kept"] > 0
    assert rep_a["kept"] == sum(t["kept"] for t in rep_a["tenants"])


def test_small_output_batches_keep_the_rows(stores, tmp_path):
    """A budget too small for one output batch: smaller row groups, the same table."""
    src = stores["parquet"]
    budget = _budget_for(60)
    assert output_batch_rows(budget, DIM) < N // 2
    _run(src, str(tmp_path / "a.parquet"))
    _run(src, str(tmp_path / "b.parquet"), "--memory-budget", str(budget))
    a, b = pq.ParquetFile(tmp_path / "a.parquet"), pq.ParquetFile(tmp_path / "b.parquet")
    assert b.metadata.num_row_groups > 1
    assert a.read().equals(b.read())
    assert a.schema_arrow.metadata == b.schema_arrow.metadata


def test_interrupted_run_resumes_from_its_parts_and_journal(stores, tmp_path, monkeypatch, capsys):
    import memforest_gpu.runs.driver as driver  # the compression of every group (runs.driver.MergerRun)

    src = stores["jsonl"]
    _run(src, str(tmp_path / "a.jsonl"), "--schedule", "matching")
    out = str(tmp_path / "b.jsonl")
    budget = _budget_for(300)
    real = driver.compress
    calls = []

    def interrupted(*args, **kwargs):  # the second group stops after its first round
        calls.append(1)
        if len(calls) == 2:
            def stop(rnd, merges):
                raise KeyboardInterrupt
            kwargs["on_round"] = stop
        return real(*args, **kwargs)

    monkeypatch.setattr(driver, "compress", interrupted)
    assert main(["compress", src, out, "--embedder", "none", "--quiet", "--schedule", "matching",
                 "--memory-budget", str(budget)]) == 130
    err = capsys.readouterr().err
    assert "1 of" in err and "--resume" in err and "merges are journaled" in err
    assert os.path.exists(out + PARTS_SUFFIX) and os.path.exists(out + ".journal.jsonl")
    assert not os.path.exists(out)
    # without --resume the journal is refused, as in the in-memory run
    assert main(["compress", src, out, "--embedder", "none", "--quiet", "--schedule", "matching",
                 "--memory-budget", str(budget)]) == 2
    assert "--resume" in capsys.readouterr().err
    monkeypatch.setattr(driver, "compress", real)
    calls.clear()
    assert main(["compress", src, out, "--embedder", "none", "--schedule", "matching",
                 "--memory-budget", str(budget), "--resume"]) == 0
    assert "resuming: 1 of" in capsys.readouterr().err
    with open(tmp_path / "a.jsonl", "rb") as f, open(out, "rb") as g:
        assert f.read() == g.read()
    assert not os.path.exists(out + PARTS_SUFFIX) and not os.path.exists(out + ".journal.jsonl")


def test_stale_parts_without_resume_are_replaced(stores, tmp_path):
    src = stores["parquet"]
    out = str(tmp_path / "b.parquet")
    os.makedirs(out + PARTS_SUFFIX)
    with open(os.path.join(out + PARTS_SUFFIX, "out-0.arrow"), "wb") as f:
        f.write(b"junk")
    rc, _ = _run(src, out, "--memory-budget", str(_budget_for(200)))
    assert rc == 0 and not os.path.exists(out + PARTS_SUFFIX)
    assert pq.read_table(out).num_rows == N // 2


def test_tenant_over_budget_is_compressed_alone_with_a_warning(stores, tmp_path, caplog):
    budget = _budget_for(50)  # the big tenant (180 nodes) and the others (60) all exceed it
    with caplog.at_level(logging.WARNING, logger="memforest_gpu"):
        rc, rep = _run(stores["parquet"], str(tmp_path / "b.parquet"), "--memory-budget", str(budget))
    assert rc == 0 and rep["nodes_out"] == N // 2
    msgs = [r.getMessage() for r in caplog.records if "compressed alone" in r.getMessage()]
    assert any("'tenant-0' has 180 nodes" in m and "over the group capacity" in m for m in msgs)


@pytest.mark.parametrize("text,value", [("4G", 4 << 30), ("512M", 512 << 20), ("1.5g", 3 << 29), ("64KiB", 64 << 10),
                                        ("1000", 1000), ("2 GB", 2 << 30), (123, 123)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text,rule", [("lots", "must be a size such as 4G"), ("4X", "must be a size"),
                                       ("-1G", "must be a size"), ("0", "must be greater than 0"),
                                       ("", "must be a size")])
def test_parse_size_errors_name_value_and_rule(text, rule):
    with pytest.raises(ValueError) as e:
        parse_size(text)
    assert rule in str(e.value) and repr(text) in str(e.value) and str(e.value).startswith("memory_budget must")
    with pytest.raises(ValueError) as e:  # the command names its flag
        parse_size(text, flag="--memory-budget")
    assert rule in str(e.value) and str(e.value).startswith("--memory-budget must")


def test_cli_refuses_a_bad_budget_before_any_work(stores, tmp_path, capsys):
    out = str(tmp_path / "b.parquet")
    assert main(["compress", stores["parquet"], out, "--memory-budget", "4 bananas"]) == 2
    assert "--memory-budget must be a size such as 4G" in capsys.readouterr().err
    assert main(["compress", stores["parquet"], out, "--memory-budget", "1G", "--dry-run"]) == 2
    assert "cannot be combined with --dry-run" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


def test_pack_groups_packs_whole_tenants_in_order():
    groups, over = pack_groups(np.array([5, 3, 4, 20, 1, 1]), 10, 80)
    assert [g.tolist() for g in groups] == [[0, 1], [2], [3], [4, 5]]  # 50 + 30 bytes fit 80 exactly
    assert over == [(3, 200)]
    assert sorted(np.concatenate(groups).tolist()) == list(range(6))


def test_heavy_tailed_sizes():
    s = heavy_tailed_sizes(1_000_000, 100_000, seed=0)
    assert s.sum() == 1_000_000 and s.min() >= 1 and len(s) == 100_000
    assert (s < 50).mean() > 0.9 and 1 <= (s > 5000).sum() <= 100
    assert np.array_equal(s, heavy_tailed_sizes(1_000_000, 100_000, seed=0))
    assert heavy_tailed_sizes(7, 7).tolist() == [1] * 7
    with pytest.raises(ValueError, match="n_tenants must be in"):
        heavy_tailed_sizes(5, 6)


def test_write_synthetic_parquet_in_batches(tmp_path):
    from memforest_gpu.store.io import read_store

    sizes = heavy_tailed_sizes(3000, 100, seed=1)
    path = str(tmp_path / "s.parquet")
    assert write_synthetic_parquet(path, sizes, dim=8, seed=2, batch_rows=500) == 3000
    assert pq.ParquetFile(path).metadata.num_row_groups >= 6
    st = read_store(path)
    assert len(st) == 3000 and st.dim == 8 and len(set(st.ids)) == 3000
    names, codes = st.tenant_index()
    assert np.bincount(codes.numpy()).tolist() == sizes.tolist()


def _jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def test_whole_store_checks_span_groups(tmp_path, capsys):
    """A duplicate id in two tenants (two groups) is refused as in the in-memory run."""
    rng = np.random.default_rng(1)
    rows = [{"id": f"n{i}", "text": f"memory {i}", "timestamp": 1.6e9 + i, "tenant": f"u{i % 4}",
             "embedding": rng.standard_normal(DIM).tolist()} for i in range(40)]
    rows[-1]["id"] = "n0"  # tenant u3 repeats tenant u0's id
    src = str(tmp_path / "dup.jsonl")
    _jsonl(src, rows)
    assert main(["compress", src, str(tmp_path / "a.jsonl"), "--embedder", "none"]) == 2
    err_a = capsys.readouterr().err
    assert main(["compress", src, str(tmp_path / "b.jsonl"), "--embedder", "none",
                 "--memory-budget", str(_budget_for(10))]) == 2
    err_b = capsys.readouterr().err
    assert "ids must be unique, got duplicate id 'n0'" in err_a
    assert err_a.split("error: ")[1] == err_b.split("error: ")[1]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_mixed_unit_and_raw_vectors(tmp_path, fmt):
    """One tenant's vectors are not unit length: the in-memory run normalises every vector
    of the store, so the groups whose vectors all are unit are normalised the same way."""
    import pyarrow as pa
    import torch

    st = synthetic_store(300, tenants=6, dim=DIM, seed=2)
    raw = torch.from_numpy(np.random.default_rng(3).standard_normal((300, DIM)).astype(np.float32))
    e = raw / raw.norm(dim=1, keepdim=True)  # unit length in float32 arithmetic (within 1e-6)
    big = torch.tensor([t == "tenant-5" for t in st.tenants])
    e[big] = raw[big] * 3.0
    redone = (e.double() / e.double().norm(dim=1)[:, None]).float()
    assert not torch.equal(redone[:50], e[:50])  # the division changes some bits of unit vectors
    table = pa.Table.from_pydict({"id": st.ids, "text": st.texts, "timestamp": st.timestamps.tolist(),
                                  "tenant": st.tenants, "embedding": e.tolist()})
    src = str(tmp_path / f"in.{fmt}")
    if fmt == "parquet":
        pq.write_table(table, src)
    else:
        _jsonl(src, table.to_pylist())
    _run(src, str(tmp_path / f"a.{fmt}"))
    _run(src, str(tmp_path / f"b.{fmt}"), "--memory-budget", str(_budget_for(60)))
    if fmt == "jsonl":
        with open(tmp_path / "a.jsonl", "rb") as f, open(tmp_path / "b.jsonl", "rb") as g:
            assert f.read() == g.read()
    else:
        assert pq.read_table(tmp_path / "a.parquet").equals(pq.read_table(tmp_path / "b.parquet"))


def test_output_batches_follow_write_stores_row_group():
    # a budgeted Parquet output is byte for byte the in-memory one only with the same row groups
    from memforest_gpu.store.parquet import ROW_GROUP_ROWS

    assert output_batch_rows(64 << 30, 384) == ROW_GROUP_ROWS
