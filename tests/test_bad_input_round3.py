"""Bad input, round three: each case gets one line on stderr naming the flag, file, line or
field and why (exit 2, or non-zero where a run failed), nothing written; a killed run leaves
nothing that a later run does not clean or report. The table-driven sweep over every case is
tests/test_no_tracebacks.py; the tests here check what each fix does beyond the one line."""
from __future__ import annotations

import json
import os

from compact_helpers import arrivals, store_of

from memforest_gpu.cli.commands import main
from memforest_gpu.store.io import write_store

PAPER = ["--preset", "paper", "--embedder", "none", "--quiet"]


def _store(tmp_path, name="store.jsonl") -> str:
    path = str(tmp_path / name)
    write_store(store_of(arrivals(0, 30, ["a", "b"])), path)
    return path


def test_a_killed_compaction_leaves_temp_files_the_next_run_removes(tmp_path, capsys, caplog):
    """``kill -9`` between creating the temp file and renaming it leaves ``.store.jsonl.<hex>.tmp``
    (and the inbox's): the next run, once it holds the store's lock, removes exactly those."""
    path = _store(tmp_path)
    left = [".store.jsonl.0123456789ab.tmp", ".store.jsonl.inbox.jsonl.ba9876543210.tmp"]
    others = [".store.jsonl.xyz.tmp", ".other.jsonl.0123456789ab.tmp", "store.jsonl.0123456789ab.tmp"]
    for name in left + others:
        (tmp_path / name).write_bytes(b"")
    with open(path + ".lock", "w") as f:  # another run (this live process) holds the store
        f.write(f"{os.getpid()}\n")
    assert main(["compact", path, "--max-nodes-per-tenant", "20", *PAPER]) == 2
    assert "another run is writing" in capsys.readouterr().err
    assert all((tmp_path / n).exists() for n in left), "never while another run holds the lock"
    os.unlink(path + ".lock")
    assert main(["compact", path, "--max-nodes-per-tenant", "20", *PAPER]) == 0
    err = caplog.text  # one warning (the command line prints it as "WARNING: ..." on stderr)
    assert f"removed 2 temporary file(s) left by an interrupted run: {left[0]}, {left[1]}" in err
    assert sorted(os.listdir(tmp_path)) == sorted(["store.jsonl", *others])


def _forest(path: str, forest) -> None:
    """Replace the event-trees state in a JSON Lines store's header."""
    with open(path) as f:
        lines = f.read().splitlines()
    head = json.loads(lines[0])
    head["__memforest__"]["forest"] = forest
    lines[0] = json.dumps(head)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def test_a_bad_event_trees_state_is_refused_and_another_version_is_said(tmp_path, capsys, caplog):
    path = _store(tmp_path)
    assert main(["compact", path, "--max-nodes-per-tenant", "20", *PAPER]) == 0  # now it has a state
    with open(path) as f:
        forest = json.loads(f.readline())["__memforest__"]["forest"]
    tenant = sorted(forest["tenants"])[0]
    bad = json.loads(json.dumps(forest))
    bad["tenants"][tenant]["p"] = -5
    _forest(path, bad)
    before = open(path, "rb").read()
    capsys.readouterr()
    assert main(["compact", path, "--max-nodes-per-tenant", "20", *PAPER]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"tenant {tenant!r} must be an object with c (centre ids), p, a (integers >= 0)" in err[0]
    assert open(path, "rb").read() == before  # not written back as it was
    _forest(path, {**forest, "version": 7})
    assert main(["info", path]) == 0
    assert "are of version 7, this memforest reads version 1: they are not used" in caplog.text


def test_streammeco_on_an_m3_agent_graph_warns_about_no_merged_vectors(tmp_path, capsys, caplog):
    """StreamMeCo removes nodes and merges none: no warning about how merged vectors are made."""
    from m3_helpers import m3_agent
    from test_m3agent import _dump, build_video

    from memforest_gpu.cli.adapters import main as graph_main

    with m3_agent() as ns:
        g, _, _ = build_video(ns.videograph)
        _dump(g, tmp_path / "video.pkl")
    out = tmp_path / "out.pkl"
    assert graph_main(["graph", "compress", str(tmp_path / "video.pkl"), str(out), "--method", "streammeco",
                       "--ratio", "0.5"]) == 0
    assert "normalised mean" not in caplog.text and "WARNING" not in capsys.readouterr().err
    assert out.exists()


def test_a_garbage_journal_record_names_its_line_and_the_remedy(tmp_path):
    import pytest

    from memforest_gpu.runs.journal import JournaledMerger

    fp = {"fingerprint": "f" * 64, "parts": {}}
    path = tmp_path / "out.jsonl.journal.jsonl"
    path.write_text(json.dumps({"memforest_journal": 1, **fp}) + "\n" + json.dumps({"k": "x", "text": "t"}) + "\n"
                    + "garbage\n")
    with pytest.raises(ValueError) as e:
        JournaledMerger(object(), path, fingerprint=fp, resume=True)
    assert str(e.value).startswith(f"{path}: line 3 must be a journal record")
    assert "the journal only saves work: delete it to start over (its merges are made again)" in str(e.value)
    path.write_text(json.dumps({"memforest_journal": 1, **fp}) + "\n" + json.dumps({"k": "x", "text": None}) + "\n")
    with pytest.raises(ValueError, match="line 2 must be a journal record"):
        JournaledMerger(object(), path, fingerprint=fp, resume=True)


def _dead_url() -> str:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"  # nothing listens there


def test_an_eval_whose_every_answer_failed_exits_non_zero_with_one_line(tmp_path, capsys):
    from published_fixtures import write_longmemeval

    bench = tmp_path / "longmemeval_s.json"
    write_longmemeval(bench)
    out = tmp_path / "out"
    rc = main(["eval", "--benchmark", str(bench), "--methods", "tome", "--ratios", "0.5", "--seeds", "0", "-k", "3",
               "--bootstrap", "10", "--out", str(out), "--quiet", "--answer-model", "qwen", "--base-url", _dead_url(),
               "--llm-option", "max_retries=0", "--llm-option", "timeout=5"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1, err
    assert err[0].startswith("memforest eval: error: every answer request failed (") and "'qwen'" in err[0]
    assert "last error: URLError" in err[0] and "check --answer-model and --base-url; no results written" in err[0]
    assert not any((out / f).exists() for f in ("results.json", "results.md", "per_question.npz"))


def test_an_eval_where_some_answers_failed_says_how_many(tmp_path, capsys):
    from published_fixtures import write_longmemeval
    from qa_server import FakeQAServer

    bench = tmp_path / "longmemeval_s.json"
    items = write_longmemeval(bench)
    out = tmp_path / "out"
    argv = ["eval", "--benchmark", str(bench), "--methods", "tome", "--ratios", "0.5", "--seeds", "0", "-k", "3",
            "--bootstrap", "10", "--out", str(out), "--quiet", "--answer-model", "fake", "--llm-option",
            "max_retries=0"]
    with FakeQAServer({it["question"]: str(it["answer"]) for it in items},
                      {("answer", "new bicycle"): ["500"] * 99}) as srv:
        assert main(argv + ["--base-url", srv.url]) == 0
    err = capsys.readouterr().err
    n = json.loads((out / "results.json").read_text())["meta"]["qa"]
    failed, asked = n["failures"]["answer failed"], n["answers_asked"]
    assert 0 < failed < asked
    assert f"memforest eval: {failed} of {asked} answers failed (not scored, left out of J" in err
    assert f"**{failed} of {asked} answers failed** (their requests got no reply" in (out / "results.md").read_text()
