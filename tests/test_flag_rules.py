"""A flag that selects data must match data, and the messages name the flag, the file and the
rule: --merge-within with a key no node has, --keep-pattern matching every node (or none), the
budget flags, a Parquet file that is not Parquet, a broken event-trees state, --report with
--dry-run, and a tenant that cannot reach its target (budget 1) reported as a shortfall."""
from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest
from compact_helpers import arrivals, store_of

from memforest_gpu.cli.commands import main
from memforest_gpu.store.io import read_store, write_store

QUIET = ["--embedder", "none", "--quiet"]


def _store(tmp_path, n=24, meta=lambda i: {"session": i // 6}) -> str:
    path = tmp_path / "in.jsonl"
    with open(path, "w") as f:
        for i, r in enumerate(arrivals(0, n, ["u"])):
            f.write(json.dumps({**r, "metadata": meta(i)}) + "\n")
    return str(path)


def test_merge_within_a_key_no_node_has_is_refused_naming_the_keys(tmp_path, capsys):
    src = _store(tmp_path)
    rc = main(["compress", src, str(tmp_path / "out.jsonl"), "--merge-within", "sesion", *QUIET])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "--merge-within must be 'timestamp' or a metadata key some node has, got 'sesion': the nodes' " \
           "metadata keys are ['session']" in err
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]
    assert main(["compress", src, str(tmp_path / "out.jsonl"), "--merge-within", "session", *QUIET]) == 0
    session = {r["id"]: r["metadata"]["session"] for r in map(json.loads, open(src))}
    out = read_store(str(tmp_path / "out.jsonl"))
    assert all(len({session[x] for x in s}) == 1 for s in out.sources)  # merged only within a session


def test_merge_within_a_key_some_nodes_lack_is_a_warning_with_the_count(tmp_path, capsys, caplog):
    src = _store(tmp_path, meta=lambda i: {"session": i // 6} if i % 4 else {})
    with caplog.at_level("WARNING", logger="memforest_gpu"):
        assert main(["compress", src, str(tmp_path / "out.jsonl"), "--merge-within", "session", *QUIET]) == 0
    assert any("merge_within 'session': 6 of 24 nodes have no value for it" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_keep_pattern_matching_every_node_is_refused(tmp_path, capsys):
    src = _store(tmp_path)
    assert main(["compress", src, str(tmp_path / "out.jsonl"), "--keep-pattern", ".", *QUIET]) == 2
    err = capsys.readouterr().err
    assert "--keep-pattern must leave some node free to merge, got '.', which matches all 24 nodes" in err
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]


def test_keep_pattern_matching_no_node_is_noted(tmp_path, capsys):
    src = _store(tmp_path)
    assert main(["compress", src, str(tmp_path / "out.jsonl"), "--keep-pattern", "^NOTHING", *QUIET]) == 0
    assert "kept: --keep-pattern '^NOTHING' matches no node" in capsys.readouterr().out


def test_a_compaction_refuses_the_same_typos(tmp_path, capsys):
    path = str(tmp_path / "s.parquet")
    write_store(store_of(arrivals(0, 30, ["a"])), path)
    before = open(path, "rb").read()
    assert main(["compact", path, "--max-nodes-per-tenant", "10", "--merge-within", "sesion", *QUIET]) == 2
    assert "--merge-within must be 'timestamp' or a metadata key some node has" in capsys.readouterr().err
    assert open(path, "rb").read() == before and os.listdir(tmp_path) == ["s.parquet"]


@pytest.mark.parametrize("cmd, flag", [(["compact", "STORE"], "--max-nodes-per-tenant"),
                                       (["mem0", "compact", "--config", "CFG"], "--max-per-user")])
def test_the_budget_message_names_its_flag(tmp_path, capsys, cmd, flag):
    path = str(tmp_path / "s.jsonl")
    write_store(store_of(arrivals(0, 4, ["a"])), path)
    (tmp_path / "m.yaml").write_text("vector_store: {provider: qdrant}\n")
    argv = [path if x == "STORE" else str(tmp_path / "m.yaml") if x == "CFG" else x for x in cmd]
    assert main(argv + [flag, "0"]) == 2
    assert f"{flag} must be an integer >= 1, got 0" in capsys.readouterr().err


@pytest.mark.parametrize("cmd, flag", [(["compact", "STORE"], "--max-nodes-per-tenant"),
                                       (["mem0", "compact", "--config", "CFG"], "--max-per-user")])
def test_a_budget_that_would_leave_no_memory_is_refused(tmp_path, capsys, cmd, flag):
    path = str(tmp_path / "s.jsonl")
    write_store(store_of(arrivals(0, 10, ["a"])), path)
    (tmp_path / "m.yaml").write_text("vector_store: {provider: qdrant}\n")
    argv = [path if x == "STORE" else str(tmp_path / "m.yaml") if x == "CFG" else x for x in cmd]
    before = open(path, "rb").read()
    for n, low, least in (("1", "0.8", 2), ("3", "0.3", 4)):
        assert main(argv + [flag, n, "--low-water", low, "--report", str(tmp_path / "r.json")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"memforest {' '.join(cmd[:-2] if cmd[0] == 'mem0' else cmd[:1])}: error: {flag} must be at "
                       f"least {least} with --low-water {low} (a tenant over budget is compacted to floor({low} x N) "
                       f"memories, which must leave one), got {n}"], err
    assert open(path, "rb").read() == before and sorted(os.listdir(tmp_path)) == ["m.yaml", "s.jsonl"]


def test_a_budget_of_two_keeps_one_memory(tmp_path, capsys):
    path = str(tmp_path / "s.jsonl")
    write_store(store_of(arrivals(0, 10, ["a"])), path)
    rep = str(tmp_path / "r.json")
    assert main(["compact", path, "--max-nodes-per-tenant", "2", "--report", rep, *QUIET, "--preset", "paper"]) == 0
    t = json.load(open(rep))["tenants"][0]
    assert (t["nodes_out"], t["shortfall"]) == (1, 0)  # floor(0.8 x 2) = 1


def test_a_parquet_store_that_is_not_parquet_names_the_file(tmp_path, capsys):
    fake = tmp_path / "s.parquet"
    fake.write_text('{"id": "a"}\n')
    assert main(["compact", str(fake), "--max-nodes-per-tenant", "4", *QUIET]) == 2
    err = capsys.readouterr().err
    assert f"{fake} must be a Parquet file" in err and len(err.strip().splitlines()) == 1, err
    assert os.listdir(tmp_path) == ["s.parquet"]


@pytest.mark.parametrize("state, message", [
    ('"a string"', "must be a JSON object with version, configs and tenants, got 'a string'"),
    ('{"version": 1, "configs": [], "tenants": {"a": "x"}}', "tenant 'a' must be an object with c (centre ids)"),
    ('{"version": 1, "configs": [{}], "tenants": {"a": {"c": ["x"], "p": 1, "a": 0, "k": 3}}}',
     "tenant 'a''s k must be an index into configs (< 1), got 3"),
    ('{"version": 1, "configs": {}, "tenants": {}}', "configs must be a list of objects, got {}"),
    ("{bad", "must be JSON, got bad JSON"),
])
def test_a_broken_event_trees_state_names_the_file_and_the_part(tmp_path, capsys, state, message):
    path = str(tmp_path / "s.parquet")
    write_store(store_of(arrivals(0, 8, ["a"])), path)
    t = pq.read_table(path)
    pq.write_table(t.replace_schema_metadata({**(t.schema.metadata or {}), b"memforest.forest": state.encode()}), path)
    assert main(["compact", path, "--max-nodes-per-tenant", "4", *QUIET]) == 2
    err = capsys.readouterr().err
    assert f"{path}: the event trees recorded in the store (memforest.forest)" in err and message in err, err


def test_compress_refuses_report_with_dry_run(tmp_path, capsys):
    src = _store(tmp_path)
    rc = main(["compress", src, str(tmp_path / "o.jsonl"), "--dry-run", "--report", str(tmp_path / "r.json"),
               *QUIET])
    assert rc == 2 and "--report applies to a run that compresses, got --dry-run" in capsys.readouterr().err
    assert os.listdir(tmp_path) == ["in.jsonl"]
