"""The path rule, property-style: for every command and every pair of its paths (the path flags,
and the files a run writes beside its output: lock, journal, parts, inbox), setting one to the
other -- as the same text, through a symlink, and through ``sub/..`` -- is refused with one line
and exit status 2, before anything is read or written."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import pytest

from memforest_gpu.cli.commands import main


def _records(n=12):
    return [{"id": f"m{i}", "text": f"Memory {i} about topic {i % 3}.", "timestamp": 1.7e9 + 3600 * i,
             "tenant": "u1" if i % 2 else "u2", "embedding": [1.0, 0.1 * i, 0.2, 0.3]} for i in range(n)]


def _locomo():
    return [{"sample_id": "c1", "conversation": {
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [{"speaker": "A", "dia_id": "D1:1", "text": "hi"},
                      {"speaker": "B", "dia_id": "D1:2", "text": "yo"}]},
        "qa": [{"question": "q?", "answer": "a", "evidence": ["D1:1"], "category": 1}]}]


@dataclass
class Command:
    """A command line with path slots: ``reads``/``writes`` name the slots and their file names;
    ``side``: files written beside a slot (slot, suffix); ``argv(p)`` builds the line."""

    name: str
    reads: dict
    writes: dict
    argv: object
    side: tuple = ()
    folders: tuple = ()  # written slots that are folders (only a file may not be one)


COMMANDS = [
    Command("compress", {"IN": "in.jsonl"}, {"OUT": "out.jsonl", "--report": "rep.json"},
            lambda p: ["compress", p["IN"], p["OUT"], "--report", p["--report"], "--embedder", "none", "--quiet"],
            side=(("OUT", ".lock"), ("OUT", ".journal.jsonl"))),
    Command("compress --memory-budget", {"IN": "in.jsonl"}, {"OUT": "out.jsonl", "--report": "rep.json"},
            lambda p: ["compress", p["IN"], p["OUT"], "--report", p["--report"], "--embedder", "none", "--quiet",
                       "--memory-budget", "1G"],
            side=(("OUT", ".lock"), ("OUT", ".journal.jsonl"), ("OUT", ".parts"))),
    Command("compact", {}, {"STORE": "store.jsonl", "--report": "rep.json"},
            lambda p: ["compact", p["STORE"], "--max-nodes-per-tenant", "4", "--report", p["--report"],
                       "--embedder", "none", "--quiet"],
            side=(("STORE", ".inbox.jsonl"), ("STORE", ".lock"), ("STORE", ".journal.jsonl"))),
    Command("compact --dry-run", {"STORE": "store.jsonl"}, {"--report": "rep.json"},
            lambda p: ["compact", p["STORE"], "--max-nodes-per-tenant", "4", "--report", p["--report"],
                       "--embedder", "none", "--quiet", "--dry-run"],
            side=(("STORE", ".inbox.jsonl"), ("STORE", ".lock"), ("STORE", ".journal.jsonl"))),
    Command("graph compress", {"IN": "g.jsonl"}, {"OUT": "go.jsonl", "--report": "rep.json"},
            lambda p: ["graph", "compress", p["IN"], p["OUT"], "--report", p["--report"], "--embedder", "none",
                       "--quiet"]),
    Command("graph compress (M3-Agent)", {"IN": "g.pkl"}, {"OUT": "go.pkl", "--report": "rep.json"},
            lambda p: ["graph", "compress", p["IN"], p["OUT"], "--report", p["--report"], "--quiet"]),
    Command("mem0 compress", {"--config": "mem0.yaml"}, {"--backup": "b.parquet", "--report": "rep.json"},
            lambda p: ["mem0", "compress", "--config", p["--config"], "--user-id", "u", "--backup", p["--backup"],
                       "--report", p["--report"]]),
    Command("mem0 compact", {"--config": "mem0.yaml"},
            {"--state": "state.json", "--backup": "b.parquet", "--report": "rep.json"},
            lambda p: ["mem0", "compact", "--config", p["--config"], "--max-per-user", "4", "--state", p["--state"],
                       "--backup", p["--backup"], "--report", p["--report"]]),
    Command("eval", {"--benchmark": "bench.json"}, {"--out": "eo", "--cache": "ec", "--export": "ex"},
            lambda p: ["eval", "--benchmark", p["--benchmark"], "--out", p["--out"], "--cache", p["--cache"],
                       "--export", p["--export"]],
            folders=("--out", "--cache", "--export")),
]


def _pairs(cmd: Command):
    """(slot to change, path it takes): every written slot set to every other slot's path (a read
    slot's, another written one's, unless both are folders) and to every side file."""
    slots = {**cmd.reads, **cmd.writes}
    for w in cmd.writes:
        for other in slots:
            if other != w and not (w in cmd.folders and other in cmd.folders):
                yield w, other, ""
        for base, suffix in cmd.side:
            if base != w:
                yield w, base, suffix


CASES = [(cmd, w, other, suffix, form) for cmd in COMMANDS for w, other, suffix in _pairs(cmd)
         for form in ("same", "symlink", "dotdot")]


def _fill(tmp_path, cmd: Command) -> None:
    (tmp_path / "sub").mkdir()
    for name in cmd.reads.values():
        (tmp_path / name).write_text(_content(name))
    if "STORE" in cmd.writes or "STORE" in cmd.reads:
        (tmp_path / "store.jsonl").write_text(_content("store.jsonl"))
        (tmp_path / "store.jsonl.inbox.jsonl").write_text(json.dumps({**_records(13)[12], "id": "new"}) + "\n")


def _content(name: str) -> str:
    if name == "bench.json":
        return json.dumps(_locomo())
    if name == "mem0.yaml":
        return "vector_store: {provider: qdrant}\n"
    if name == "g.jsonl":
        return "".join(json.dumps({"kind": "node", **r}) + "\n" for r in _records())
    if name == "g.pkl":
        return "not read: the paths are refused first"
    return "".join(json.dumps(r) + "\n" for r in _records())


def _snapshot(root) -> dict:
    out = {}
    for d, dirs, files in os.walk(root):
        for f in files + [x for x in dirs if os.path.islink(os.path.join(d, x))]:
            p = os.path.join(d, f)
            out[os.path.relpath(p, root)] = os.readlink(p) if os.path.islink(p) else open(p, "rb").read()
        out.update({os.path.relpath(os.path.join(d, x), root): "dir" for x in dirs})
    return out


@pytest.mark.parametrize("cmd, slot, other, suffix, form", CASES,
                         ids=[f"{c.name}:{w}={o}{s}:{f}" for c, w, o, s, f in CASES])
def test_a_path_that_is_another_of_the_commands_paths_is_refused(tmp_path, capsys, monkeypatch, cmd, slot, other,
                                                                 suffix, form):
    monkeypatch.chdir(tmp_path)
    _fill(tmp_path, cmd)
    paths = {k: str(tmp_path / v) for k, v in {**cmd.reads, **cmd.writes}.items()}
    target = paths[other] + suffix
    if form == "symlink":
        link = tmp_path / f"link-{os.path.basename(target)}"
        link.symlink_to(target)
        paths[slot] = str(link)
    elif form == "dotdot":
        paths[slot] = os.path.join(str(tmp_path), "sub", os.pardir, os.path.basename(target))
    else:
        paths[slot] = target
    before = _snapshot(tmp_path)
    rc = main(cmd.argv(paths))
    err = capsys.readouterr().err
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert slot in err or slot in ("IN", "OUT", "STORE"), err  # the message names the flag it refuses
    assert _snapshot(tmp_path) == before  # nothing written: no output, lock, journal, report, inbox change


def test_a_path_through_a_missing_folder_is_refused_naming_it(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in.jsonl").write_text(_content("in.jsonl"))
    rc = main(["compress", "in.jsonl", "./nosub/../out.jsonl", "--embedder", "none", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and "OUTPUT must be a path the system can follow" in err and "'./nosub'" in err, err
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]


def test_eval_refuses_a_benchmark_that_is_one_of_its_outputs(tmp_path, capsys):
    (tmp_path / "eo").mkdir()
    (tmp_path / "eo" / "results.json").write_text(json.dumps(_locomo()))
    before = _snapshot(tmp_path)
    rc = main(["eval", "--benchmark", str(tmp_path / "eo" / "results.json"), "--out", str(tmp_path / "eo")])
    assert rc == 2 and "--out's results.json must not be the input file" in capsys.readouterr().err
    assert _snapshot(tmp_path) == before


def test_the_rule_itself(tmp_path):
    from memforest_gpu.runs.paths import check_paths, output_files, reads, same_path, writes

    a = tmp_path / "a.jsonl"
    a.write_text("x")
    os.link(a, tmp_path / "hard.jsonl")
    assert same_path(str(a), str(tmp_path / "hard.jsonl")) == "is a hard link to"
    assert same_path(str(a), str(tmp_path / "b.jsonl")) is None
    check_paths(reads("INPUT", a), output_files("OUTPUT", tmp_path / "b.jsonl"), writes("--report", None))
    with pytest.raises(ValueError, match=r"^OUTPUT must not be the input file: .* is a hard link to"):
        check_paths(reads("INPUT", a), output_files("OUTPUT", tmp_path / "hard.jsonl"))
    two_readers = reads("INPUT", a) + reads("--config", a)  # reading one file twice is fine
    check_paths(two_readers)


@pytest.mark.parametrize("side", [".inbox.jsonl", ".journal.jsonl", ".lock"])
def test_a_store_file_linked_to_the_store_is_refused(tmp_path, capsys, side):
    """A hostile layout: the inbox, journal or lock of STORE is a symlink to STORE itself."""
    store = tmp_path / "s.jsonl"
    store.write_text(_content("s.jsonl"))
    (tmp_path / f"s.jsonl{side}").symlink_to(store)
    before = _snapshot(tmp_path)
    assert main(["compact", str(store), "--max-nodes-per-tenant", "4", "--embedder", "none"]) == 2
    err = capsys.readouterr().err
    assert "must not be STORE" in err and "is a link to" in err, err
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("argv", [["compress", "IN", "OUT", "--report", ""], ["compress", "IN", "OUT", "--embedder",
                                                                                "none", "--report", " "]])
def test_an_empty_report_path_is_refused(tmp_path, capsys, argv):
    (tmp_path / "in.jsonl").write_text(_content("in.jsonl"))
    argv = [str(tmp_path / "in.jsonl") if x == "IN" else str(tmp_path / "o.jsonl") if x == "OUT" else x for x in argv]
    assert main(argv) == 2
    assert "--report must be a path, got" in capsys.readouterr().err
    assert os.listdir(tmp_path) == ["in.jsonl"]


def test_the_distributed_command_follows_the_rule(tmp_path):
    import subprocess
    import sys

    import memforest_gpu

    (tmp_path / "in.jsonl").write_text(_content("in.jsonl"))
    root = os.path.dirname(os.path.dirname(os.path.abspath(memforest_gpu.__file__)))  # the package under test
    p = subprocess.run([sys.executable, "-m", "memforest_gpu.distributed", "compress", "in.jsonl", "o.jsonl",
                        "--report", "o.jsonl", "--embedder", "none"], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": root})
    assert p.returncode == 2 and "--report must not be OUTPUT" in p.stderr, p.stderr
    assert os.listdir(tmp_path) == ["in.jsonl"]


def test_an_input_inside_the_parts_folder_is_refused(tmp_path, capsys):
    """The parts folder of a --memory-budget run is deleted whole when it ends: an input inside
    it would be deleted with it."""
    (tmp_path / "o.jsonl.parts").mkdir()
    src = tmp_path / "o.jsonl.parts" / "in.jsonl"
    src.write_text(_content("in.jsonl"))
    before = _snapshot(tmp_path)
    assert main(["compress", str(src), str(tmp_path / "o.jsonl"), "--memory-budget", "1G", "--embedder", "none",
                 "--quiet"]) == 2
    assert "INPUT must not be inside the parts folder of OUTPUT" in capsys.readouterr().err
    assert _snapshot(tmp_path) == before
