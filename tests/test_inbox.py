"""The inbox protocol (docs/compaction.md, "The inbox"): complete records end with a newline; a
last partial line is left and reported; glued or bad lines refuse the run naming the file and
the line; ids the store holds are counted (and refused where their text differs, unless
--replace-changed); a missing tenant needs a single-tenant store; a dry run writes nothing and
runs on a read-only store."""
from __future__ import annotations

import builtins
import errno
import json
import os
from collections import Counter

import pytest
from compact_helpers import arrivals, store_of

from memforest_gpu.cli.commands import main
from memforest_gpu.config import CompactConfig, CompressConfig
from memforest_gpu.runs.compacting_store import CompactingStore
from memforest_gpu.store.io import read_store, write_store

PAPER = ["--preset", "paper", "--embedder", "none", "--quiet"]


@pytest.fixture(params=["parquet", "jsonl"])
def store(request, tmp_path):
    """A store of tenants a and b (30 memories each) in memforest's Parquet layout (rows pass
    through) or JSON Lines (read whole)."""
    (tmp_path / "store").mkdir()
    path = str(tmp_path / "store" / f"s.{request.param}")
    write_store(store_of(arrivals(0, 30, ["a", "b"])), path)
    return path


def _inbox(path: str, text: str) -> str:
    with open(path + ".inbox.jsonl", "w") as f:
        f.write(text)
    return path + ".inbox.jsonl"


def _rec(i: int, tenant="a", **kw) -> dict:
    r = arrivals(9, i + 1, [tenant])[i]
    r.update(kw)
    return r


def _line(r: dict) -> str:
    return json.dumps(r) + "\n"


def _compact(path, *extra, budget="100"):
    return main(["compact", path, "--max-nodes-per-tenant", budget, *PAPER, *extra])


def _files(path) -> dict:
    d = os.path.dirname(path)
    return {f: open(os.path.join(d, f), "rb").read() for f in sorted(os.listdir(d))}


def test_a_last_line_without_its_newline_is_left_and_reported(store, capsys):
    box = _inbox(store, _line(_rec(0)) + _line(_rec(1)) + json.dumps(_rec(2)))
    writer = open(box, "a")  # the writer of the last line, still writing
    assert _compact(store) == 0
    out = capsys.readouterr().out
    taken = store + ".inbox.taken-1.jsonl"  # the inbox the run took (the live one is gone until the next append)
    assert "2 inbox records folded in" in out
    assert f"1 incomplete line left in {taken}" in out
    body = _line(_rec(0)) + _line(_rec(1)) + json.dumps(_rec(2))
    assert open(taken).read() == body and not os.path.exists(box)  # left whole: the store records what it folded
    writer.write("\n")  # the writer finishes its record, in the file it opened
    writer.close()
    assert _compact(store) == 0
    assert "1 inbox records folded in" in capsys.readouterr().out
    assert not os.path.exists(box) and not os.path.exists(taken)
    assert Counter(read_store(store).tenants)["a"] == 33


@pytest.mark.parametrize("text, line, reason", [
    (_line(_rec(0)) + json.dumps(_rec(1)) + _line(_rec(2)), 2, "two records glued on one line"),
    (_line(_rec(0)) + '{"id": "x", bad}\n', 2, "bad JSON (Expecting property name enclosed in double quotes, "
                                               "column 13)"),
    ("\n" + _line(_rec(0)) + "[1, 2]\n", 3, "a record must be a JSON object, got list"),
    (_line(_rec(0)) + _line({"id": "x", "text": "t"}), 2, "a record must have 'timestamp'"),
    (_line(_rec(0)) + _line(_rec(0)), 2, "id must be new to the inbox, got 'a-s9-0', already on line 1"),
    (_line(_rec(0)) + _line(_rec(1, text="")), 2, "text of node 'a-s9-1' must be a non-empty string"),
    (_line(_rec(0, embedding=[1.0, 2.0])), 1, "embedding of record 'a-s9-0' must have the store's dimension (16), "
                                              "got 2"),
])
def test_a_bad_line_refuses_the_run_naming_file_line_and_reason(store, capsys, text, line, reason):
    box = _inbox(store, text)
    before = _files(store)
    assert _compact(store, budget="20") == 2
    err = capsys.readouterr().err
    assert f"{box}, line {line}: " in err and reason in err, err
    assert len(err.strip().splitlines()) == 1
    assert _files(store) == before  # nothing folded in, nothing compacted, the inbox as it was


def test_hostile_inboxes_are_one_line(store, capsys):
    os.mkdir(store + ".inbox.jsonl")
    assert _compact(store) == 2
    err = capsys.readouterr().err
    assert f"the inbox of STORE ({os.path.basename(store)}.inbox.jsonl) must be a file, got the directory" in err
    assert _compact(store, "--dry-run") == 2
    assert "must be a file of JSON lines, got a folder" in capsys.readouterr().err
    os.rmdir(store + ".inbox.jsonl")
    box = _inbox(store, "[" * 100_000 + "\n")
    before = _files(store)
    assert _compact(store) == 2
    assert f"{box}, line 1: a record must be a flat JSON object, got nesting too deep" in capsys.readouterr().err
    assert _files(store) == before


def test_records_the_store_holds_are_counted_and_not_folded_again(store, capsys):
    held = read_store(store).records(with_embedding=True)[3]
    _inbox(store, _line(held) + _line(_rec(0)))
    assert _compact(store) == 0
    out = capsys.readouterr().out
    assert "1 inbox records folded in" in out
    assert "1 inbox record(s) already in the store (same id and text, or merged): not folded in again" in out
    assert Counter(read_store(store).ids)[held["id"]] == 1


def test_an_inbox_of_known_records_only_is_emptied_without_rewriting_the_store(store, capsys):
    held = read_store(store).records(with_embedding=True)[3]
    box = _inbox(store, _line(held))
    before = open(store, "rb").read()
    assert _compact(store) == 0
    out = capsys.readouterr().out
    assert "1 inbox record(s) already in the store" in out and "the store is unchanged" in out
    assert open(store, "rb").read() == before and not os.path.exists(box)


def test_a_known_id_with_other_text_is_refused_unless_replace_changed(store, capsys):
    held = read_store(store).records(with_embedding=True)[4]
    new = dict(held, text="Something else entirely.")
    box = _inbox(store, _line(_rec(0)) + _line(new))
    before = _files(store)
    assert _compact(store) == 2
    err = capsys.readouterr().err
    assert f"{box}, line 2: text of record {held['id']!r} must equal the text of the store's node" in err
    assert "--replace-changed" in err and _files(store) == before
    assert _compact(store, "--replace-changed") == 0
    assert "1 store memories replaced by inbox records" in capsys.readouterr().out
    after = {r["id"]: r for r in read_store(store).records()}
    assert after[held["id"]]["text"] == "Something else entirely." and len(after) == 61
    assert sorted(x for r in after.values() for x in r["sources"]) == sorted(after)  # every original once


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_replacing_a_tree_centre_partitions_its_tenant_again(tmp_path, capsys, fmt):
    path = str(tmp_path / f"c.{fmt}")
    write_store(store_of(arrivals(0, 30, ["a", "b"])), path)
    assert _compact(path, budget="20") == 0  # records the trees and their centres
    capsys.readouterr()
    st = read_store(path)
    nodes = {r["id"]: r for r in st.records(with_embedding=True)}
    centre = next(c for c in st.event_trees.tenants["a"].centres if c in nodes and nodes[c]["sources"] == [c])
    _inbox(path, _line(dict(nodes[centre], text="A new text for the centre.")))
    assert _compact(path, "--replace-changed", budget="20") == 0
    assert "1 store memories replaced" in capsys.readouterr().out
    st = read_store(path)
    ids = [x for s in st.sources for x in s]
    assert sorted(ids) == sorted(set(ids)) and centre in ids and len(ids) == 60
    assert set(st.event_trees.tenants) == {"b"}  # a's trees lost their centre: a is partitioned at its next run
    assert _compact(path, budget="15") == 0
    assert "partitioned in full" in capsys.readouterr().out


@pytest.mark.parametrize("flag", [[], ["--replace-changed"]])
def test_an_id_inside_a_merged_node_refuses_the_run(store, capsys, flag):
    assert _compact(store, budget="20") == 0  # merges: some originals now live inside merged nodes
    capsys.readouterr()
    merged = next(r for r in read_store(store).records() if len(r["sources"]) > 1)
    gone = merged["sources"][0]
    box = _inbox(store, _line(_rec(0)) + _line(_rec(1, id=gone, text="whatever it said")))
    before = _files(store)
    assert _compact(store, *flag, budget="100") == 2
    err = capsys.readouterr().err
    assert f"{box}, line 2: id of record {gone!r} must be new to the store, got an original inside the merged node " \
           f"{merged['id']!r}" in err and "give the record a new id" in err
    assert len(err.strip().splitlines()) == 1
    assert _files(store) == before  # nothing folded in, the inbox as it was


def test_sources_naming_a_held_original_are_refused_naming_inbox_and_record(store, capsys):
    held = read_store(store).ids[0]
    box = _inbox(store, _line(_rec(0, sources=["a-s9-0", held])))
    assert _compact(store) == 2
    err = capsys.readouterr().err
    assert f"{box}, line 1: sources of record 'a-s9-0' must not name a memory the store holds, got {held!r}" in err


def test_a_missing_tenant_needs_a_single_tenant_store(store, tmp_path, capsys):
    box = _inbox(store, _line({k: v for k, v in _rec(0).items() if k != "tenant"}))
    assert _compact(store) == 2
    assert f"{box}, line 1: tenant of record 'a-s9-0' must be given when the store has 2 tenants" in \
        capsys.readouterr().err
    one = str(tmp_path / "one.jsonl")
    write_store(store_of(arrivals(0, 10, ["solo"])), one)
    _inbox(one, _line({k: v for k, v in _rec(0).items() if k != "tenant"}))
    assert _compact(one) == 0
    assert Counter(read_store(one).tenants) == {"solo": 11}  # never a tenant named "default"


def test_compacting_store_add_follows_the_tenant_rule(tmp_path):
    path = str(tmp_path / "s.parquet")
    write_store(store_of(arrivals(0, 10, ["a", "b"])), path)
    cs = CompactingStore(path, CompactConfig(max_nodes=100), CompressConfig.preset("paper"), auto=False)
    with pytest.raises(ValueError, match="tenant of a new memory must be given when the store has 2 tenants"):
        cs.add([{k: v for k, v in _rec(0).items() if k != "tenant"}])
    assert not os.path.exists(path + ".inbox.jsonl")
    cs.add([_rec(0)])
    assert cs.counts() == {"a": 11, "b": 10}


@pytest.fixture
def read_only(monkeypatch):
    """``read_only(folder)``: every write into ``folder`` fails as on a read-only mount (EROFS)
    -- creating, opening for writing, renaming, deleting -- since chmod does not stop root."""

    folders = []

    def inside(p) -> bool:
        return any(os.path.abspath(os.fspath(p)).startswith(f + os.sep) or os.path.abspath(os.fspath(p)) == f
                   for f in folders)

    def refuse(p):
        raise OSError(errno.EROFS, "Read-only file system", os.fspath(p))

    real_open, real_os_open = builtins.open, os.open
    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def ro_open(file, mode="r", *a, **kw):
        if isinstance(file, (str, os.PathLike)) and inside(file) and set(mode) & set("wax+"):
            refuse(file)
        return real_open(file, mode, *a, **kw)

    def ro_os_open(path, flags, *a, **kw):
        if inside(path) and flags & writing:
            refuse(path)
        return real_os_open(path, flags, *a, **kw)

    monkeypatch.setattr(builtins, "open", ro_open)
    monkeypatch.setattr(os, "open", ro_os_open)
    for name in ("unlink", "remove", "mkdir", "rmdir"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda p, *a, _real=real, **kw: refuse(p) if inside(p) else _real(p, *a, **kw))
    for name in ("replace", "rename"):
        real = getattr(os, name)
        monkeypatch.setattr(os, name, lambda s, d, *a, _real=real, **kw: refuse(d) if inside(s) or inside(d)
                            else _real(s, d, *a, **kw))
    return folders.append


def test_a_dry_run_writes_nothing_and_runs_on_a_read_only_store(store, capsys, read_only):
    _inbox(store, _line(_rec(0)) + json.dumps(_rec(1)))
    before = _files(store)
    read_only(os.path.dirname(store))
    rep = os.path.join(os.path.dirname(os.path.dirname(store)), "report.json")  # asked for, beside the store's folder
    assert main(["compact", store, "--max-nodes-per-tenant", "20", *PAPER, "--dry-run", "--report", rep]) == 0
    out = capsys.readouterr().out
    assert "dry run: nothing merged, nothing written" in out and "1 incomplete line left" in out
    assert _files(store) == before  # no lock, no journal, no change to the store or its inbox
    assert json.load(open(rep))["dry_run"] is True


def test_compact_on_a_read_only_store_says_so_before_any_work(store, capsys, read_only):
    before = _files(store)
    read_only(os.path.dirname(store))
    assert main(["compact", store, "--max-nodes-per-tenant", "20", *PAPER]) == 2
    err = capsys.readouterr().err
    assert "STORE must be in a writable folder" in err and "Read-only file system" in err and "Errno" not in err
    assert _files(store) == before


def test_the_protocol_is_documented():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    doc = open(os.path.join(root, "docs", "compaction.md"), encoding="utf-8").read()
    for rule in ("ends with a newline", "incomplete line left in", "line number", "--replace-changed",
                 "single tenant", "nothing is folded in"):
        assert rule in doc, rule
