"""Resume: the merge journal, a crash inside a run, and `memforest compress --resume`
after a SIGKILL of a real CLI process that merges through the `openai` merger."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
from paper import paper_config, paper_merge, paper_partition
from test_openai_merger import FakeChatServer, _store  # noqa: E402 (tests/ is on sys.path)

from memforest_gpu.api import compress_file
from memforest_gpu.config import CompressConfig, MergeConfig, PartitionConfig
from memforest_gpu.mergers import ExtractiveMerger, get_merger
from memforest_gpu.mergers.base import MemoryItem, MergePair
from memforest_gpu.runs.journal import JournaledMerger, journal_path, run_fingerprint
from memforest_gpu.store.io import write_store

CFG = paper_config(partition=paper_partition(alpha=0.1), merge=paper_merge(ratio=0.5))
T0 = 1683554160.0


class Crash(BaseException):
    """Stands for a kill: not an Exception, so the engine's fallback does not catch it."""


class Counting:
    """The extractive merger, recording every pair it is sent; crashes on call ``crash_at``."""

    name = "extractive"

    def __init__(self, crash_at: int | None = None):
        self.inner, self.crash_at = ExtractiveMerger(), crash_at
        self.sent: list[tuple[str, str]] = []
        self.calls = 0

    def identity(self):
        return {"name": "extractive", "near_duplicate": 0.9}

    def merge(self, pairs):
        self.calls += 1
        if self.calls == self.crash_at:
            raise Crash()
        self.sent += [(p.older.id, p.newer.id) for p in pairs]
        return self.inner.merge(pairs)


@pytest.fixture
def store_file(tmp_path):
    path = tmp_path / "in.jsonl"
    write_store(_store(), path)
    return str(path)


def _run(src, dst, merger, **kw):
    return compress_file(src, dst, CFG, embedder="none", merger=merger, progress=False, **kw)


# --------------------------------------------------------------------------- journal
def _pairs(n):
    return [MergePair(MemoryItem(f"a{i}", f"A {i}.", T0), MemoryItem(f"b{i}", f"B {i}.", T0 + 1), "t")
            for i in range(n)]


def test_journal_replays_and_cuts_a_torn_line(tmp_path):
    path = tmp_path / "j.jsonl"
    fp = {"fingerprint": "f1", "parts": {"x": 1}}
    jm = JournaledMerger(Counting(), path, fingerprint=fp, checkpoint_every=2)
    out = jm.merge(_pairs(5))
    jm.close()
    lines = path.read_bytes().splitlines()
    assert len(lines) == 6 and json.loads(lines[0])["fingerprint"] == "f1"
    with open(path, "ab") as f:
        f.write(b'{"k": "torn')  # a kill in the middle of a write
    inner = Counting()
    jm2 = JournaledMerger(inner, path, fingerprint=fp, resume=True)
    assert jm2.merge(_pairs(7)) == out + ExtractiveMerger().merge(_pairs(7)[5:])
    assert inner.sent == [("a5", "b5"), ("a6", "b6")] and jm2.stats == {"replayed": 5, "journaled": 2}
    jm2.close()
    assert len(path.read_bytes().splitlines()) == 8  # the torn line is gone, not glued to a record


def test_journal_refuses_without_resume_and_with_another_fingerprint(tmp_path):
    path = tmp_path / "j.jsonl"
    jm = JournaledMerger(Counting(), path, fingerprint={"fingerprint": "f1", "parts": {"config": 1, "merger": 1}})
    jm.merge(_pairs(1))
    jm.close()
    with pytest.raises(ValueError, match="pass resume=True .* or delete the file"):
        JournaledMerger(Counting(), path, fingerprint={"fingerprint": "f1", "parts": {}})
    with pytest.raises(ValueError, match="another run \\(its config differ"):
        JournaledMerger(Counting(), path, fingerprint={"fingerprint": "f2", "parts": {"config": 2, "merger": 1}},
                        resume=True)


def test_a_journal_from_before_the_spanning_rename_resumes(store_file, tmp_path):
    """A journal whose config names the spanning stage ``"tree"`` (written before the rename)
    belongs to the same run; another config under the old name is still refused."""
    import hashlib

    def old_header(fp):
        parts = json.loads(json.dumps(fp["parts"]))
        parts["config"] = {("tree" if k == "spanning" else k): v for k, v in parts["config"].items()}
        digest = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode("utf-8")).hexdigest()
        return {"fingerprint": digest, "parts": parts}

    fp = run_fingerprint(store_file, CFG, ExtractiveMerger(), None)
    path = tmp_path / "j.jsonl"
    jm = JournaledMerger(Counting(), path, fingerprint=old_header(fp))
    out = jm.merge(_pairs(3))
    jm.close()
    inner = Counting()
    again = JournaledMerger(inner, path, fingerprint=fp, resume=True)
    assert again.merge(_pairs(3)) == out and inner.sent == [] and again.stats["replayed"] == 3
    again.close()
    other = dataclasses.replace(CFG, merge=dataclasses.replace(CFG.merge, ratio=0.3))
    with pytest.raises(ValueError, match="another run"):
        JournaledMerger(Counting(), path, fingerprint=run_fingerprint(store_file, other, ExtractiveMerger(), None),
                        resume=True)


def test_journal_with_a_torn_header_starts_over(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_bytes(b'{"memforest_jour')
    jm = JournaledMerger(Counting(), path, fingerprint={"fingerprint": "f", "parts": {}}, resume=True)
    jm.merge(_pairs(1))
    jm.close()
    assert [json.loads(x).get("memforest_journal") for x in path.read_bytes().splitlines()] == [1, None]


def test_fingerprint_covers_input_config_and_merger(store_file, tmp_path):
    base = run_fingerprint(store_file, CFG, ExtractiveMerger(), None)["fingerprint"]
    assert base == run_fingerprint(store_file, CFG, ExtractiveMerger(), None)["fingerprint"]
    other_cfg = paper_config(merge=paper_merge(ratio=0.3))
    assert base != run_fingerprint(store_file, other_cfg, ExtractiveMerger(), None)["fingerprint"]
    assert base != run_fingerprint(store_file, CFG, ExtractiveMerger(near_duplicate=0.8), None)["fingerprint"]
    assert base != run_fingerprint(store_file, CFG, ExtractiveMerger(), "all-MiniLM-L6-v2")["fingerprint"]
    a = get_merger("openai", model="m1", base_url="http://127.0.0.1:1/v1")
    b = get_merger("openai", model="m1", base_url="http://127.0.0.1:2/v1", max_concurrency=3)
    assert run_fingerprint(store_file, CFG, a, None) == run_fingerprint(store_file, CFG, b, None)  # same texts
    c = get_merger("openai", model="m2", base_url="http://127.0.0.1:1/v1")
    assert run_fingerprint(store_file, CFG, a, None) != run_fingerprint(store_file, CFG, c, None)
    with open(store_file, "a") as f:
        f.write("\n")
    assert base != run_fingerprint(store_file, CFG, ExtractiveMerger(), None)["fingerprint"]


# --------------------------------------------------------------------------- crash + resume in process
def test_crash_then_resume_equals_an_uninterrupted_run(store_file, tmp_path):
    ref = tmp_path / "ref.jsonl"
    full = Counting()
    _run(store_file, ref, full)
    assert not os.path.exists(journal_path(ref))  # deleted once the output is written
    assert full.calls >= 4

    out = tmp_path / "out.jsonl"
    first = Counting(crash_at=4)
    with pytest.raises(Crash):
        _run(store_file, out, first)
    assert not out.exists() and os.path.exists(journal_path(out))
    with pytest.raises(ValueError, match="pass resume=True"):
        _run(store_file, out, Counting())
    second = Counting()
    _run(store_file, out, second, resume=True)
    assert out.read_bytes() == ref.read_bytes()
    assert not set(first.sent) & set(second.sent)  # nothing journaled was merged again
    assert sorted(first.sent + second.sent) == sorted(full.sent)
    assert not os.path.exists(journal_path(out))


@pytest.mark.parametrize("budget", [[], ["--memory-budget", "1G"]])
def test_resume_without_a_journal_says_so_and_runs_from_the_beginning(store_file, tmp_path, caplog, capsys, budget):
    from memforest_gpu.cli.commands import main

    out = tmp_path / "out.jsonl"
    with caplog.at_level("WARNING", logger="memforest_gpu"):
        assert main(["compress", store_file, str(out), "--embedder", "none", "--quiet", "--resume", *budget]) == 0
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert said == [f"--resume: no journal of an interrupted run at '{journal_path(out)}': nothing to resume, "
                    "starting from the beginning"], said
    caplog.clear()
    first = Counting(crash_at=2)  # a journal to resume: no such warning
    with pytest.raises(Crash):
        _run(store_file, tmp_path / "again.jsonl", first)
    with caplog.at_level("WARNING", logger="memforest_gpu"):
        _run(store_file, tmp_path / "again.jsonl", Counting(), resume=True)
    assert not [r for r in caplog.records if "nothing to resume" in r.getMessage()]


def test_resume_with_other_options_is_refused(store_file, tmp_path):
    out = tmp_path / "out.jsonl"
    with pytest.raises(Crash):
        _run(store_file, out, Counting(crash_at=2))
    other = paper_config(partition=paper_partition(alpha=0.1), merge=paper_merge(ratio=0.4))
    with pytest.raises(ValueError, match="belongs to another run \\(its config differ"):
        compress_file(store_file, out, other, embedder="none", merger=Counting(), progress=False, resume=True)


# --------------------------------------------------------------------------- SIGKILL a real CLI run
def _journal_records(path) -> list[dict]:
    try:
        lines = open(path, "rb").read().split(b"\n")[1:-1]
    except FileNotFoundError:
        return []
    return [json.loads(x) for x in lines]


def _cli(src, dst, url, *extra):
    cmd = [sys.executable, "-m", "memforest_gpu.cli", "compress", src, dst, "--merger", "openai", "--model",
           "fake-model", "--base-url", url, "--embedder", "none", "--preset", "paper", "--alpha", "0.1", "--quiet",
           *extra]
    return cmd


def _sent_pairs(requests) -> set[tuple[str, str]]:
    pat = re.compile(r'<memory_\d date="[^"]+">\n(.*?)\n</memory_\d>', re.DOTALL)
    return {tuple(pat.findall(r["messages"][1]["content"])) for r in requests}


def test_sigkill_then_cli_resume(store_file, tmp_path):
    ref, out = str(tmp_path / "ref.jsonl"), str(tmp_path / "out.jsonl")
    with FakeChatServer(block_after=8) as srv:
        proc = subprocess.Popen(_cli(store_file, out, srv.url), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while not (srv.blocked and _journal_records(journal_path(out))):  # mid-round, journal written
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline, "the run never reached the blocking round"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        journaled = _journal_records(journal_path(out))
        assert len(journaled) == 8 and not os.path.exists(out)
        done_inputs = {srv.replied[r["text"]] for r in journaled}

        srv.block_after = None
        srv.release()
        n_before = len(srv.requests)
        again = subprocess.run(_cli(store_file, out, srv.url), capture_output=True, text=True, timeout=120)
        assert again.returncode == 2 and "--resume" in again.stderr
        res = subprocess.run(_cli(store_file, out, srv.url, "--resume"), capture_output=True, text=True,
                             timeout=120)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "resumed: 8 merges replayed from the journal" in res.stdout
        resumed_requests = srv.requests[n_before:]

        merger = get_merger("openai", model="fake-model", base_url=srv.url)
        compress_file(store_file, ref, CFG, embedder="none", merger=merger, progress=False)

    assert not done_inputs & _sent_pairs(resumed_requests)  # no journaled merge was sent again
    assert len(resumed_requests) == merger.stats["pairs"] - 8
    assert open(out, "rb").read() == open(ref, "rb").read()
    assert not os.path.exists(journal_path(out))
    rows = [json.loads(x) for x in open(out, encoding="utf-8")]
    assert sorted(s for r in rows if "id" in r for s in r["sources"]) == sorted(f"m{i}" for i in range(48))


def test_a_dead_llm_server_stops_the_run_after_one_round(store_file, tmp_path):
    with FakeChatServer() as srv:
        url = srv.url  # closed when the block ends: nothing listens there
    out = tmp_path / "out.jsonl"
    m = get_merger("openai", model="m", base_url=url, max_retries=0, timeout=0.5)
    with pytest.raises(ValueError, match="openai merger failed on every request of round 1: .*127.0.0.1"):
        _run(store_file, out, m)
    assert m.stats["pairs"] == 4  # one round, not the whole store merged without the model
    assert not out.exists() and not os.path.exists(journal_path(out))  # fallbacks were not journaled
    m2 = Counting()
    _run(store_file, out, m2)  # a fresh start needs no --resume
    assert out.exists()


def test_a_merger_without_identity_gets_a_stable_fingerprint(store_file):
    class Plain:
        name = "plain"

        def merge(self, pairs):
            return ExtractiveMerger().merge(pairs)

    assert run_fingerprint(store_file, CFG, Plain(), None) == run_fingerprint(store_file, CFG, Plain(), None)


# --------------------------------------------------------------------------- CLI
def test_cli_dry_run_prints_the_first_round_and_writes_nothing(store_file, tmp_path, capsys):
    from memforest_gpu.cli.commands import main

    out = tmp_path / "out.jsonl"
    assert main(["compress", store_file, str(out), "--embedder", "none", "--preset", "paper", "--alpha", "0.1",
                 "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert re.search(r"first round: 4 merges planned over 2 tenant\(s\); similarity min 0\.\d+", text)
    rows = [ln for ln in text.splitlines() if ln.startswith("user")]
    assert len(rows) == 4 and all(re.match(r"user\d\s+0\.\d{3}\s+m\d+\s+m\d+\s+'Memory", r) for r in rows)
    assert "nothing written" in text
    assert os.listdir(tmp_path) == ["in.jsonl"]


def test_cli_merger_flags_are_checked(store_file, tmp_path, capsys):
    from memforest_gpu.cli.commands import main

    out = str(tmp_path / "out.jsonl")
    assert main(["compress", store_file, out, "--base-url", "http://127.0.0.1:1/v1"]) == 2
    assert "--base-url applies to the openai merger" in capsys.readouterr().err
    assert main(["compress", store_file, out, "--merger", "openai"]) == 2
    assert "needs model" in capsys.readouterr().err
    assert os.listdir(tmp_path) == ["in.jsonl"]


def test_cli_openai_run_prints_merger_stats(store_file, tmp_path, capsys):
    from memforest_gpu.cli.commands import main

    out, report = tmp_path / "out.jsonl", tmp_path / "run.json"
    with FakeChatServer({"item 105": ["nodate", "nodate"]}) as srv:
        rc = main(["compress", store_file, str(out), "--merger", "openai", "--model", "m", "--base-url", srv.url,
                   "--max-concurrency", "4", "--max-tokens", "50", "--embedder", "none", "--alpha", "0.1",
                   "--quiet", "--report", str(report)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert re.search(r"merger openai: 24 merges in \d+ calls; \d+ accepted, \d+ retried \(0 accepted on retry\), "
                     r"\d+ fell back to the extractive merger \(dropped a date: 1\)", text)
    assert re.search(r"merger speed: [\d.]+ merges/s, \d+ generated tokens/s", text)
    assert "throughput: 24 merges in" in text
    assert all(b["max_tokens"] == 50 for b in srv.requests)
    stats = json.loads(report.read_text())["merger_stats"]
    assert stats["pairs"] == 24 and stats["fallbacks"] == 1
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl", "out.jsonl", "run.json"]
