"""compact on files: in place, atomic, journaled; the inbox; the service object; the CLI; a
real kill -9 in the middle of a sequence of compactions."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pytest
from compact_helpers import arrivals, check_compaction, origin_tenants, same_store, store_of

from memforest_gpu.cli.commands import main as cli
from memforest_gpu.config import CompactConfig, CompressConfig
from memforest_gpu.engine.compaction import compact
from memforest_gpu.runs.compact_run import compact_file
from memforest_gpu.runs.compacting_store import CompactingStore
from memforest_gpu.runs.inbox_files import inbox_path
from memforest_gpu.store.io import read_store, write_store
from memforest_gpu.store.splice import append

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAPER = CompressConfig.preset("paper")
BUDGET = CompactConfig(max_nodes={"a": 50, "b": 80, "c": 40}, low_water=0.8)


def _add_to_inbox(path: str, recs: list[dict]) -> None:
    with open(inbox_path(path), "a") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_file_compactions_equal_the_in_memory_ones(tmp_path, fmt):
    recs = arrivals(0, 60, ["a", "b", "c"])
    path = str(tmp_path / f"s.{fmt}")
    write_store(store_of(recs), path)
    mem, owner = read_store(path), origin_tenants(recs)
    for k in range(6):
        r = compact_file(path, BUDGET, PAPER, embedder="none")
        before = mem
        res = compact(mem, BUDGET, PAPER, device="cpu")
        mem = res.store
        got = read_store(path)
        check_compaction(before, res, BUDGET, owner)
        assert same_store(got, mem) and r.written
        assert not os.path.exists(path + ".journal.jsonl") and not os.path.exists(path + ".lock")
        new = arrivals(k + 1, 10, ["a", "b", "c"][: k % 3 + 1])
        owner.update(origin_tenants(new))
        _add_to_inbox(path, new)
        mem = append(mem, store_of(new))
    assert compact_file(path, CompactConfig(max_nodes=10_000), PAPER, embedder="none").written  # the inbox
    assert not compact_file(path, CompactConfig(max_nodes=10_000), PAPER, embedder="none").written  # nothing to do


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_an_inbox_folded_by_a_killed_run_is_not_folded_twice(tmp_path, monkeypatch, fmt):
    import memforest_gpu.runs.compact_run as run_module

    path = str(tmp_path / f"s.{fmt}")
    write_store(store_of(arrivals(0, 30, ["a", "b"])), path)
    _add_to_inbox(path, arrivals(1, 25, ["a"]))  # a goes over budget: some of these records are merged
    saved = open(inbox_path(path), "rb").read()
    real = run_module.release
    monkeypatch.setattr(run_module, "release", lambda store, folded: None)  # killed after writing the store
    compact_file(path, CompactConfig(max_nodes=40), PAPER, embedder="none")
    after = read_store(path)
    taken = path + ".inbox.taken-1.jsonl"
    assert not os.path.exists(inbox_path(path)) and open(taken, "rb").read() == saved
    assert any(len(s) > 1 and any(x.startswith("a-s1-") for x in s) for s in after.sources)
    _add_to_inbox(path, arrivals(2, 1, ["b"]))  # appended since
    monkeypatch.setattr(run_module, "release", real)
    r = compact_file(path, CompactConfig(max_nodes=40), PAPER, embedder="none")
    assert r.inbox == 1 and r.inbox_known == 0 and r.report.merges == 0  # the taken records are not read again
    assert not os.path.exists(taken) and not os.path.exists(inbox_path(path))
    ids = [x for s in read_store(path).sources for x in s]
    assert sorted(ids) == sorted([x for s in after.sources for x in s] + ["b-s2-0"])


def test_service_object_carries_on_after_a_restart(tmp_path):
    path = str(tmp_path / "s.parquet")
    write_store(store_of(arrivals(0, 20, ["a", "b"])), path)
    cs = CompactingStore(path, CompactConfig(max_nodes=30, low_water=0.5), PAPER)
    assert cs.add(arrivals(1, 5, ["a"])) is None  # 25 <= 30: only the inbox grows
    assert cs.counts() == {"a": 25, "b": 20}
    cs2 = CompactingStore(path, CompactConfig(max_nodes=30, low_water=0.5), PAPER)  # a new process
    res = cs2.add(arrivals(2, 6, ["a"]))
    assert res is not None and res.written and cs2.counts() == {"a": 15, "b": 20}
    st = read_store(path)
    assert sorted(x for s in st.sources for x in s) == sorted(
        [r["id"] for k, n in ((0, 20), (1, 5), (2, 6)) for r in arrivals(k, n, ["a", "b"] if k == 0 else ["a"])])
    plain = next(r for r in st.records(with_embedding=True) if r["sources"] == [r["id"]])
    again = cs2.add([{k: plain[k] for k in ("id", "text", "timestamp", "tenant", "embedding")}] + arrivals(3, 1, ["b"]))
    assert again is None and cs2.compact().inbox == 1 and cs2.counts() == {"a": 15, "b": 21}  # idempotent by id
    inside = next(x for s in st.sources if len(s) > 1 for x in s)
    with pytest.raises(ValueError, match=f"id of a new memory must not be an original inside a merged node, got "
                                         f"'{inside}'"):
        cs2.add([dict(arrivals(5, 1, ["a"])[0], id=inside)])
    assert cs2.counts() == {"a": 15, "b": 21}  # nothing appended
    cs2.add(arrivals(4, 1, ["b"]))
    with pytest.raises(ValueError, match="inbox already"):
        cs2.add(arrivals(4, 1, ["b"]))


def test_cli_compact(tmp_path, capsys):
    path = str(tmp_path / "s.parquet")
    write_store(store_of(arrivals(0, 60, ["a", "b"])), path)
    before = open(path, "rb").read()
    assert cli(["compact", path, "--max-nodes-per-tenant", "50", "--ratio", "0.5"]) == 2
    assert "--ratio does not apply" in capsys.readouterr().err
    assert cli(["compact", path, "--max-nodes-per-tenant", "50", "--dry-run", "--preset", "paper",
                "--embedder", "none"]) == 0
    assert "dry run" in capsys.readouterr().out and open(path, "rb").read() == before
    rep = str(tmp_path / "r.json")
    assert cli(["compact", path, "--max-nodes-per-tenant", "50", "--preset", "paper", "--embedder", "none",
                "--report", rep, "--low-water", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "2 of 2 tenants over budget" in out and f"wrote {path}" in out
    d = json.load(open(rep))
    assert [t["nodes_out"] for t in d["tenants"]] == [25, 25] and d["written"]
    assert cli(["compact", path, "--max-nodes-per-tenant", "50", "--preset", "paper", "--embedder", "none"]) == 0
    assert "nothing written" in capsys.readouterr().out


_SCRIPT = textwrap.dedent('''
    import json, os, sys
    sys.path.insert(0, sys.argv[1])
    from compact_helpers import arrivals
    from memforest_gpu.config import CompactConfig, CompressConfig
    from memforest_gpu.mergers.extractive import ExtractiveMerger
    from memforest_gpu.runs.compact_run import compact_file
    from memforest_gpu.runs.inbox_files import inbox_files, inbox_path

    class Killer(ExtractiveMerger):
        """The extractive merger; kills its own process (kill -9) at its call number kill_at."""
        def __init__(self, kill_at):
            super().__init__()
            self.calls, self.kill_at = 0, kill_at
        def merge(self, pairs):
            self.calls += 1
            if self.calls == self.kill_at:
                os.kill(os.getpid(), 9)
            return super().merge(pairs)
        def identity(self):
            return {"name": "extractive", "test": "killer"}

    path, lo, hi, kill_at = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    budget = CompactConfig(max_nodes={"a": 50, "b": 80, "c": 40}, low_water=0.8)
    for k in range(lo, hi):
        if not inbox_files(path) or k > lo:  # a killed run's step: its inbox is there, taken
            with open(inbox_path(path), "a") as f:
                for r in arrivals(k + 1, 10, ["a", "b", "c"][: k % 3 + 1]):
                    f.write(json.dumps(r) + "\\n")
        r = compact_file(path, budget, CompressConfig.preset("paper"), embedder="none",
                         merger=Killer(kill_at if k == lo else 0))
        print(json.dumps({"step": k, "merges": r.report.merges, "replayed": r.replayed}), flush=True)
''')


def _steps(tmp_path, path, lo, hi, kill_at=0):
    script = tmp_path / "seq.py"
    script.write_text(_SCRIPT)
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, str(script), os.path.join(ROOT, "tests"), path, str(lo), str(hi),
                           str(kill_at)], capture_output=True, text=True, env=env, timeout=600)


def test_kill_9_in_the_middle_of_a_sequence(tmp_path):
    start = str(tmp_path / "start.parquet")
    write_store(store_of(arrivals(0, 60, ["a", "b", "c"])), start)
    ref, killed = str(tmp_path / "ref.parquet"), str(tmp_path / "killed.parquet")
    shutil.copy(start, ref)
    shutil.copy(start, killed)
    r = _steps(tmp_path, ref, 0, 12)  # twelve compactions, uninterrupted
    assert r.returncode == 0, r.stderr
    r = _steps(tmp_path, killed, 0, 6)
    assert r.returncode == 0, r.stderr
    before = open(killed, "rb").read()
    r = _steps(tmp_path, killed, 6, 7, kill_at=2)  # kill -9 at the merger's second call of compaction 7
    assert r.returncode == -9, (r.returncode, r.stdout, r.stderr)
    assert open(killed, "rb").read() == before  # the previous store, intact
    assert os.path.exists(killed + ".inbox.taken-1.jsonl") and os.path.exists(killed + ".lock")  # taken, not folded
    assert not os.path.exists(inbox_path(killed))
    with open(killed + ".journal.jsonl") as f:
        assert len(f.read().splitlines()) >= 2  # the header and the first round's merges
    r = _steps(tmp_path, killed, 6, 12)  # a re-run: takes over the stale lock, replays the journal
    assert r.returncode == 0, r.stderr
    steps = [json.loads(x) for x in r.stdout.splitlines()]
    assert steps[0]["replayed"] > 0 and steps[0]["merges"] > steps[0]["replayed"]
    assert same_store(read_store(killed), read_store(ref))
    assert not os.path.exists(killed + ".journal.jsonl") and not os.path.exists(killed + ".lock")
    assert not [f for f in os.listdir(tmp_path) if ".inbox." in f]
    got = read_store(killed)
    n = {t: int(c) for t, c in zip(got.tenant_table, np.bincount(got.tenant_codes_np))}
    assert all(n[t] <= b for t, b in BUDGET.max_nodes.items())


def test_a_store_naming_its_model_in_a_column_is_compacted_on_the_fast_path(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    from memforest_gpu.runs import compact_files
    from memforest_gpu.store.embedder_io import file_embedder

    path = str(tmp_path / "s.parquet")
    st = store_of(arrivals(0, 30, ["a", "b"]))
    st.embedder = "some/model"
    write_store(st, path)
    assert "embedder" in pq.read_schema(path).names
    assert compact_files.memforest_layout(compact_files.parquet_schema(path))
    loads = []
    real = compact_files.PassThrough.load
    monkeypatch.setattr(compact_files.PassThrough, "load", lambda self, t: loads.append(t) or real(self, t))
    _add_to_inbox(path, arrivals(1, 5, ["a"]))
    assert compact_file(path, CompactConfig(max_nodes=30), PAPER, embedder="none").written
    assert loads == [["a"]]  # the rows passed through; only the tenant over budget was converted
    table = pq.read_table(path)
    assert table.column("embedder").to_pylist() == ["some/model"] * table.num_rows  # the new rows name it too
    assert file_embedder(pq.ParquetFile(path), path) == "some/model"
    tree = table.column("tree").to_pylist()
    j = table.column("tenant").to_pylist().index("a")  # a row of the tenant the next run converts
    tree[j] = -3
    bad = table.set_column(table.schema.get_field_index("tree"), "tree",
                           pa.array(tree, type=pa.int64())).replace_schema_metadata(table.schema.metadata)
    pq.write_table(bad, path)
    _add_to_inbox(path, arrivals(2, 10, ["a"]))  # a goes over its budget again
    with pytest.raises(ValueError, match=f"{path}: node {table.column('id')[j].as_py()!r}: tree must be an integer "
                                         ">= 0 or null"):
        compact_file(path, CompactConfig(max_nodes=30), PAPER, embedder="none")


@pytest.mark.parametrize("budget", [200, 60])  # every row fits (appended as they are) / tenants merged down
@pytest.mark.parametrize("fast", [True, False])  # the Parquet fast path (rows passed through) / the whole store
def test_an_int8_store_stays_int8_when_float_records_arrive(tmp_path, monkeypatch, budget, fast):
    """Inbox records carry float vectors; the compacted file keeps its int8 codes, so its bytes
    stay bounded by its nodes (a float32 rewrite would take 4x the vector bytes)."""
    import pyarrow.parquet as pq

    from memforest_gpu.store.synthetic import synthetic_store

    if not fast:
        monkeypatch.setattr("memforest_gpu.runs.compact_run.memforest_layout", lambda schema: False)
    st = synthetic_store(400, tenants=2, dim=16, seed=3)
    path = str(tmp_path / "s.parquet")
    first = st.take(list(range(300)))
    first.vector_codes = "int8"
    write_store(first, path)
    with open(inbox_path(path), "w") as f:
        for r in list(st.take(list(range(300, 400))).records()):
            r["embedding"] = [float(x) for x in r["embedding"]]
            f.write(json.dumps(r) + "\n")
    assert cli(["compact", path, "--max-nodes-per-tenant", str(budget), "--embedder", "none", "--quiet"]) == 0
    assert pq.read_schema(path).field("embedding").type.value_type == pa.int8()
    back = read_store(path)
    assert back.vector_codes == "int8" and len(back) <= 2 * budget
    assert sorted(x for s in back.sources for x in s) == sorted(st.ids)  # nothing lost


def test_the_old_budget_keyword_names_the_limits(tmp_path):
    """``budget=`` is the old name of ``limits=`` (one more release, a DeprecationWarning)."""
    from memforest_gpu.runs.compacting_store import CompactingStore

    limits = CompactConfig(max_nodes=5)
    with pytest.warns(DeprecationWarning, match="limits"):
        cs = CompactingStore(tmp_path / "s.parquet", budget=limits)
    assert cs.limits is limits and limits.max_nodes_of("a") == 5 and not hasattr(limits, "budget")
    from memforest_gpu.store.synthetic import synthetic_store

    store = synthetic_store(40, tenants=2, dim=8, seed=0)
    with pytest.warns(DeprecationWarning, match=r"compact\(budget=...\) is renamed compact\(limits=...\)"):
        assert len(compact(store, budget=CompactConfig(max_nodes=1000)).store) == 40  # no tenant over its limit
    with pytest.raises(TypeError, match="missing its limits"):
        compact_file(tmp_path / "s.parquet")
