"""The paths users take first (issue 15's defects): the input is never destroyed, output
problems are found before any work, journal errors are never merger failures, stores with
their own vectors keep them, timestamps are range-checked, Ctrl-C and concurrent runs are
handled, and the smaller papercuts."""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from datetime import UTC

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_openai_merger import FakeChatServer, _store  # noqa: E402 (tests/ is on sys.path)

import memforest_gpu.cli.compress as cli_compress
from memforest_gpu.cli.commands import main
from memforest_gpu.store.io import read_store, write_store


def _jsonl(path, n=24, dim=8, embed=True, tenants=("u1", "u2"), ts=None, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((4, dim))
    with open(path, "w") as f:
        for i in range(n):
            rec = {"id": f"m{i}", "text": f"Memory number {i} about topic {i % 4}.",
                   "timestamp": (ts(i) if ts else 1.7e9 + 3600 * i), "tenant": tenants[i % len(tenants)]}
            if embed:
                rec["embedding"] = (centres[i % 4] + 0.3 * rng.standard_normal(dim)).tolist()
            f.write(json.dumps(rec) + "\n")
    return str(path)


@pytest.fixture
def model_loads(monkeypatch):
    """Counts how many times a sentence-transformers model is loaded."""
    import sentence_transformers

    loads = []
    real = sentence_transformers.SentenceTransformer

    class Counting(real):
        def __init__(self, *a, **kw):
            loads.append(a[0] if a else kw.get("model_name_or_path"))
            super().__init__(*a, **kw)

    monkeypatch.setattr(sentence_transformers, "SentenceTransformer", Counting)
    return loads


# ------------------------------------------------------------- 1. the input is never destroyed
@pytest.mark.parametrize("form", ["same", "parquet", "dot-slash", "symlink", "hardlink"])
def test_compress_refuses_an_output_that_is_its_input(tmp_path, capsys, monkeypatch, form):
    src = _jsonl(tmp_path / "in.jsonl")
    if form == "parquet":
        write_store(read_store(src), tmp_path / "in.parquet")
        os.unlink(src)
        src = str(tmp_path / "in.parquet")
    before = open(src, "rb").read()
    out = src
    if form == "dot-slash":
        monkeypatch.chdir(tmp_path)
        src, out = "in.jsonl", "./in.jsonl"
    elif form == "symlink":
        out = str(tmp_path / "link.jsonl")
        os.symlink(src, out)
    elif form == "hardlink":
        out = str(tmp_path / "hard.jsonl")
        os.link(src, out)
    listing = sorted(os.listdir(tmp_path))
    rc = main(["compress", src, out, "--embedder", "none", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "must not be the input file" in err and len(err.strip().splitlines()) == 1, err
    assert open(tmp_path / os.path.basename(str(src)), "rb").read() == before
    assert sorted(os.listdir(tmp_path)) == listing  # no journal, no lock, no temp file


def test_graph_compress_refuses_its_input_as_output(tmp_path, capsys):
    g = tmp_path / "g.jsonl"
    g.write_text("".join(json.dumps({"kind": "node", "id": f"n{i}", "text": f"Node {i}.", "timestamp": i,
                                     "embedding": [1.0, 0.1 * i]}) + "\n" for i in range(6)))
    before = g.read_bytes()
    assert main(["graph", "compress", str(g), str(g), "--embedder", "none", "--quiet"]) == 2
    assert "must not be the input file" in capsys.readouterr().err
    assert g.read_bytes() == before


# ------------------------------------------------------------- 2. journal errors are not merger failures
def test_llm_merges_kept_when_the_output_folder_does_not_exist(tmp_path, capsys, caplog):
    src = str(tmp_path / "in.jsonl")
    write_store(_store(), src)
    out = tmp_path / "new" / "sub" / "out.jsonl"
    with FakeChatServer() as srv, caplog.at_level("WARNING", logger="memforest_gpu"):
        rc = main(["compress", src, str(out), "--merger", "openai", "--model", "m", "--base-url", srv.url,
                   "--embedder", "none", "--alpha", "0.1", "--quiet"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == []  # no batch "failed"
    assert not re.search(r"[1-9]\d* merges fell back", cap.out), cap.out
    assert re.search(r"merger openai: 24 merges in \d+ calls; 24 accepted, .* 0 fell back", cap.out), cap.out
    assert "in all: 24 of 24 merges kept the openai merger's text, 0 used the extractive merger" in cap.out
    assert "merger texts replaced" not in cap.out  # the engine replaced nothing
    assert out.exists() and sorted(os.listdir(out.parent)) == ["out.jsonl"]  # journal and lock gone


def test_a_journal_write_error_stops_the_run(tmp_path, capsys, monkeypatch):
    """The output's folder disappears mid-run: the journal cannot be written. That must stop
    the run (no fallback merges, no output), not count as a merger failure."""
    from memforest_gpu.mergers import ExtractiveMerger

    src = _jsonl(tmp_path / "in.jsonl", n=40)
    out = tmp_path / "work" / "out.jsonl"

    class Vanishing(ExtractiveMerger):
        calls = 0

        def merge(self, pairs):
            Vanishing.calls += 1
            shutil.rmtree(out.parent, ignore_errors=True)
            return super().merge(pairs)

    monkeypatch.setattr(cli_compress, "get_merger", lambda name, **kw: Vanishing())
    rc = main(["compress", src, str(out), "--embedder", "none", "--quiet"])
    cap = capsys.readouterr()
    assert rc == 2
    assert "cannot write the merge journal" in cap.err and "failed on a batch" not in cap.err, cap.err
    assert Vanishing.calls == 1 and not out.exists()


# ------------------------------------------------------------- 3. the output target is checked first
@pytest.fixture
def input_never_read(monkeypatch):
    import memforest_gpu.store.jsonl as jsonl

    def boom(*a, **kw):
        raise AssertionError("the input was read before the output target was checked")

    monkeypatch.setattr(jsonl, "read_jsonl_columns", boom)


@pytest.mark.parametrize("target, extra, message", [
    ("out.csv", [], "--out-format"),
    ("-", [], "must be a file path"),
    ("out.jsonl", ["--out-format", "csv"], "--out-format must be one of ['parquet', 'jsonl'], got 'csv'"),
    ("adir.jsonl", [], "must be a file, got the directory"),
    ("out.jsonl", ["--report", "rdir"], "--report must be a file, got the directory"),
])
def test_bad_output_targets_fail_before_any_work(tmp_path, capsys, input_never_read, target, extra, message):
    src = _jsonl(tmp_path / "in.jsonl")
    (tmp_path / "adir.jsonl").mkdir()
    (tmp_path / "rdir").mkdir()
    extra = [str(tmp_path / x) if x == "rdir" else x for x in extra]
    out = target if target == "-" else str(tmp_path / target)
    listing = sorted(os.listdir(tmp_path))
    rc = main(["compress", src, out, "--embedder", "none", "--quiet"] + extra)
    err = capsys.readouterr().err
    assert rc == 2 and message in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert sorted(os.listdir(tmp_path)) == listing  # no output, no journal


def test_a_read_only_output_folder_fails_before_any_work(tmp_path, capsys, monkeypatch, input_never_read):
    src = _jsonl(tmp_path / "in.jsonl")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    if os.geteuid() == 0:  # root writes anywhere: make the folder refuse like a read-only mount
        real_open = os.open

        def ro_open(path, flags, *a, **kw):
            if os.path.dirname(os.path.abspath(path)) == str(ro) and flags & os.O_CREAT:
                raise PermissionError(13, "Permission denied", path)
            return real_open(path, flags, *a, **kw)

        monkeypatch.setattr(os, "open", ro_open)
    try:
        rc = main(["compress", src, str(ro / "out.jsonl"), "--embedder", "none", "--quiet"])
        err = capsys.readouterr().err
    finally:
        ro.chmod(0o755)
    assert rc == 2 and "must be in a writable folder" in err, err
    assert os.listdir(ro) == []


def test_the_corrected_command_runs_after_a_failed_validation(tmp_path, capsys):
    src = _jsonl(tmp_path / "in.jsonl")
    assert main(["compress", src, str(tmp_path / "out.txt"), "--embedder", "none", "--quiet"]) == 2
    assert main(["compress", src, str(tmp_path / "out.jsonl"), "--embedder", "none", "--quiet"]) == 0
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl", "out.jsonl"]


# ------------------------------------------------------------- 4. stores with their own vectors
@pytest.mark.parametrize("dim", [8, 384])
def test_unrecorded_vectors_are_never_assumed_minilm(tmp_path, capsys, caplog, model_loads, dim):
    src = _jsonl(tmp_path / "in.jsonl", dim=dim)
    out = tmp_path / "out.jsonl"
    with caplog.at_level("WARNING", logger="memforest_gpu"):
        rc = main(["compress", src, str(out), "--quiet"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "--embedder PATH" in warnings[0] and "not recorded" in warnings[0]
    assert model_loads == []  # MiniLM never loaded
    assert "embedder mean-of-inputs" in cap.out
    st = read_store(out)
    assert st.embedder is None and st.dim == dim
    first = json.loads(out.read_text().splitlines()[0])
    assert "embedder" not in first.get("__memforest__", {})  # no model name written for these vectors


def test_minilm_is_loaded_once_to_embed_a_store_without_vectors(tmp_path, capsys, model_loads):
    src = _jsonl(tmp_path / "in.jsonl", embed=False)
    out = tmp_path / "out.parquet"
    assert main(["compress", src, str(out), "--quiet"]) == 0
    assert len(model_loads) == 1
    assert read_store(out).embedder == "all-MiniLM-L6-v2"


def test_search_auto_embeds_a_store_without_vectors(tmp_path, capsys, model_loads):
    src = _jsonl(tmp_path / "in.jsonl", n=12, embed=False)
    rc = main(["search", src, "Memory number 5", "--tenant", "u2", "-k", "3", "--json"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    hits = json.loads(cap.out)
    assert hits[0]["id"] == "m5" and len(model_loads) == 1


def test_search_auto_on_unrecorded_vectors_asks_for_the_model(tmp_path, capsys, model_loads):
    src = _jsonl(tmp_path / "in.jsonl", n=12, dim=384)
    assert main(["search", src, "topic", "--tenant", "u1"]) == 2
    err = capsys.readouterr().err
    assert "does not record the model of its vectors" in err and "--embedder PATH" in err
    assert model_loads == []


def test_info_reports_a_store_without_vectors(tmp_path, capsys, model_loads):
    src = _jsonl(tmp_path / "in.jsonl", n=10, embed=False)
    assert main(["info", src, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["nodes"] == 10 and info["tenants"] == 2 and info["has_embeddings"] is False
    assert info["dim"] is None and model_loads == []
    assert main(["info", src]) == 0
    assert "no embeddings stored" in capsys.readouterr().out


# ------------------------------------------------------------- 5. timestamps
@pytest.mark.parametrize("value", [1.7e12, "1700000000000", 1.7e15])
def test_epoch_timestamps_past_year_9999_are_refused_naming_node_and_field(tmp_path, capsys, value):
    src = _jsonl(tmp_path / "in.jsonl", n=6, ts=lambda i: value if i == 3 else 1.7e9 + i)
    rc = main(["compress", src, str(tmp_path / "out.jsonl"), "--embedder", "none", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "timestamp of node 'm3' must be a date in the years 1..9999" in err, err
    assert "looks like epoch m" in err  # milli- or microseconds
    assert os.listdir(tmp_path) == ["in.jsonl"]


def test_parquet_millisecond_integers_are_refused(tmp_path, capsys):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["x", "y"], "timestamp": [1_700_000_000_000, 5],
                             "embedding": [[1.0, 0.0], [0.0, 1.0]]}), path)
    assert main(["info", str(path)]) == 2
    err = capsys.readouterr().err
    assert "timestamp of node 'a'" in err and "milliseconds" in err and "14 November 2023" in err


def test_parse_timestamp_checks_one_range_for_every_form():
    from datetime import datetime, timedelta, timezone

    from memforest_gpu.store.timeutil import EPOCH_MAX, EPOCH_MIN, parse_timestamp

    assert parse_timestamp(EPOCH_MAX) == EPOCH_MAX and parse_timestamp(EPOCH_MIN) == EPOCH_MIN
    assert parse_timestamp("9999-12-31T23:59:59Z") == EPOCH_MAX
    for bad in (EPOCH_MAX + 1, EPOCH_MIN - 1, str(EPOCH_MAX + 1), np.float64(1e13), np.int64(10 ** 13),
                "0001-01-01T00:00:00+01:00",
                datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=2)))):
        with pytest.raises(ValueError, match="where must be a date in the years 1..9999"):
            parse_timestamp(bad, where="where")
    with pytest.raises(ValueError) as e:
        parse_timestamp("0001-01-01T00:00:00+01:00", where="where")
    assert "milliseconds" not in str(e.value)  # only numbers get the unit hint


# ------------------------------------------------------------- 6. Ctrl-C and concurrent runs
def test_ctrl_c_prints_one_line_and_exits_130_then_resumes(tmp_path, capsys, monkeypatch):
    from memforest_gpu.mergers import ExtractiveMerger

    src = _jsonl(tmp_path / "in.jsonl", n=40)
    out = tmp_path / "out.jsonl"

    class CtrlC(ExtractiveMerger):
        calls = 0

        def merge(self, pairs):
            CtrlC.calls += 1
            if CtrlC.calls == 3:
                raise KeyboardInterrupt
            return super().merge(pairs)

    monkeypatch.setattr(cli_compress, "get_merger", lambda name, **kw: CtrlC())
    try:
        # the paper preset: sequential rounds, so the third merger call comes before the end
        rc = main(["compress", src, str(out), "--embedder", "none", "--quiet", "--preset", "paper"])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped main() as a traceback")
    err = capsys.readouterr().err
    assert rc == 130
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert re.fullmatch(r"memforest compress: interrupted; \d+ merges are journaled in '.*out\.jsonl\.journal"
                        r"\.jsonl': rerun the same command with --resume to continue from them", lines[0]), lines[0]
    assert not out.exists() and not os.path.exists(str(out) + ".lock")
    monkeypatch.undo()
    assert main(["compress", src, str(out), "--embedder", "none", "--quiet", "--preset", "paper", "--resume"]) == 0
    assert len(read_store(out)) == 20 and not os.path.exists(str(out) + ".journal.jsonl")


def test_a_second_run_to_the_same_output_is_refused(tmp_path, capsys, monkeypatch):
    from memforest_gpu.api import compress_file
    from memforest_gpu.config import CompressConfig
    from memforest_gpu.mergers import ExtractiveMerger

    src = _jsonl(tmp_path / "in.jsonl", n=40)
    out = tmp_path / "out.jsonl"
    entered, leave = threading.Event(), threading.Event()

    class Slow(ExtractiveMerger):
        def merge(self, pairs):
            entered.set()
            assert leave.wait(60)
            return super().merge(pairs)

    first: dict = {}

    def run_first():
        try:
            first["result"] = compress_file(src, out, CompressConfig(), embedder="none", merger=Slow(),
                                            progress=False)
        except BaseException as e:  # noqa: BLE001 - reported below
            first["error"] = e

    t = threading.Thread(target=run_first)
    t.start()
    try:
        assert entered.wait(60)
        rc = main(["compress", src, str(out), "--embedder", "none", "--quiet"])
        err = capsys.readouterr().err
    finally:
        leave.set()
        t.join(60)
    assert rc == 2 and f"another run is writing {str(out)!r}" in err, err
    assert "error" not in first and len(read_store(out)) == 20
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl", "out.jsonl"]


def test_a_stale_lock_is_taken_over(tmp_path, capsys):
    src = _jsonl(tmp_path / "in.jsonl")
    out = tmp_path / "out.jsonl"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "out.jsonl.lock").write_text(f"{dead.pid}\n")
    assert main(["compress", src, str(out), "--embedder", "none", "--quiet"]) == 0
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl", "out.jsonl"]
    (tmp_path / "out.jsonl.lock").write_text(f"{os.getpid()}\n")  # a live holder
    assert main(["compress", src, str(out), "--embedder", "none", "--quiet"]) == 2
    assert "another run is writing" in capsys.readouterr().err


# ------------------------------------------------------------- 7. the smaller items
def _all_parsers():
    from memforest_gpu.cli.commands import build_parser

    def walk(p, name):
        yield name, p
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for n, sp in a.choices.items():
                    yield from walk(sp, f"{name} {n}")

    return list(walk(build_parser(), "memforest"))


def test_help_has_one_line_and_the_default_for_every_option():
    for name, p in _all_parsers():
        text = p.format_help()
        assert "SPEC" not in text, name
        for a in p._actions:
            if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) or a.help == argparse.SUPPRESS:
                continue  # a renamed flag's old spelling is hidden (cli/flags.py add_renamed_flag)
            assert a.help, f"{name}: {a.option_strings or a.dest} has no help"
            if a.option_strings and a.default not in (None, False):
                assert "(default" in p._get_formatter()._expand_help(a), f"{name}: {a.option_strings}"
    compress = dict(_all_parsers())["memforest compress"].format_help()
    assert re.search(r"--ratio RATIO\s+fraction of each tenant's nodes to remove \(default:\s+0\.5\)", compress)


@pytest.mark.parametrize("args, want, not_want", [
    (["OUT.xyz"], "or pass --out-format FORMAT", "format=..."),
    (["OUT.jsonl", "--format", "csv"], "--format must be one of",
     "format must be one of ['parquet', 'jsonl'], got 'csv'"),
    (["OUT.jsonl", "--embedder", "/no/such/model"], "--embedder must be one of", "allow_download"),
])
def test_errors_name_cli_flags(tmp_path, capsys, args, want, not_want):
    src = _jsonl(tmp_path / "in.jsonl")
    args = [str(tmp_path / args[0])] + args[1:]
    assert main(["compress", src] + args + ["--quiet"]) == 2
    err = capsys.readouterr().err
    assert want in err and not_want not in err.replace("--format must", ""), err


def test_a_left_journal_names_the_resume_flag(tmp_path, capsys):
    src = _jsonl(tmp_path / "in.jsonl")
    (tmp_path / "out.jsonl.journal.jsonl").write_text("")
    assert main(["compress", src, str(tmp_path / "out.jsonl"), "--embedder", "none", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "--resume" in err and "resume=True" not in err


def test_cheap_argument_errors_come_before_the_model_loads(tmp_path, capsys, model_loads):
    src = _jsonl(tmp_path / "in.jsonl", n=10, embed=False)
    assert main(["search", src, "topic", "--tenant", "nobody"]) == 2
    assert "tenant must be one of ['u1', 'u2'], got 'nobody'" in capsys.readouterr().err
    assert main(["demo", "--ratio", "2"]) == 2
    assert "ratio must be in" in capsys.readouterr().err
    assert model_loads == []


def test_search_output_has_no_raw_control_characters(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    rows = [{"id": f"n{i}", "text": f"memory {i} \x1b[2J\x07 bell\nnext line", "timestamp": 1.7e9 + i}
            for i in range(3)]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["search", str(src), "memory 1", "-k", "2"]) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert len(lines) == 2 and "\\x1b[2J\\x07 bell\\nnext line" in out
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f]", out)
    from memforest_gpu.cli.commands import printable

    assert printable("a\u202eb\x9bc") == "a\\u202eb\\x9bc"  # bidi override, C1 control


EVIL = "evil\nTOTAL 9999 FORGED\x1b[31m"


@pytest.mark.parametrize("cmd", [["compress", "IN", "OUT"], ["compress", "IN", "OUT", "--dry-run"],
                                 ["compact", "IN", "--max-nodes-per-tenant", "8"]])
def test_tables_escape_tenant_names(tmp_path, capsys, cmd):
    src = _jsonl(tmp_path / "in.jsonl", tenants=("u1", EVIL))
    argv = [src if x == "IN" else str(tmp_path / "out.jsonl") if x == "OUT" else x for x in cmd]
    assert main([*argv, "--embedder", "none", "--quiet", "--preset", "paper"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and not any(line.startswith("TOTAL") for line in out.splitlines()), out
    assert "evil\\nTOTAL 9999 FORGED\\x1b[31m"[:24 if cmd[-1] != "--dry-run" else 16] in out


def test_the_mem0_plan_escapes_names_ids_and_texts():
    from types import SimpleNamespace

    from memforest_gpu.adapters.mem0.plan_text import format_plan

    group = SimpleNamespace(tenant=EVIL, members=["m\x1b[2J1", "m2"], new_id="n\r1", text="merged \x1b[31m text")
    res = SimpleNamespace(scope=SimpleNamespace(describe=lambda: f"user_id={EVIL}"), n_in=2, groups=[group],
                          left_alone={}, previews={"m2": ("2024-01-01\x07", "a \x1b]8;;http://x\x07link")})
    out = format_plan(res)
    assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f]", out), out
    assert not any(line.startswith("TOTAL") for line in out.splitlines())
    assert "[evil\\nTOTAL 9999 FORGED\\x1b[31m]" in out and "m\\x1b[2J1" in out


def test_search_k_above_the_tenants_nodes_is_cut_to_them_with_one_warning(tmp_path, capsys, monkeypatch, caplog):
    from eval_fixtures import BagOfWordsEmbedder

    from memforest_gpu import api
    from memforest_gpu.retrieval.retriever import Retriever

    emb = BagOfWordsEmbedder()
    src = tmp_path / "in.jsonl"
    texts = [f"memory {i} about topic {i % 3}" for i in range(12)]
    src.write_text("".join(json.dumps({"id": f"m{i}", "text": t, "timestamp": 1.7e9 + i, "tenant": f"u{i % 2}",
                                       "embedding": v}) + "\n" for i, (t, v) in enumerate(zip(texts, emb.embed(texts)
                                                                                               .tolist()))))
    monkeypatch.setattr(api, "load_store_and_embedder",
                        lambda p, **kw: (api.read_store(p, tenants=kw["tenants"]), emb))
    asked = []
    search = Retriever.search
    monkeypatch.setattr(Retriever, "search",
                        lambda self, q, **kw: asked.append(kw["config"].k) or search(self, q, **kw))
    with caplog.at_level("WARNING", logger="memforest_gpu"):
        assert main(["search", str(src), "memory 3", "--tenant", "u1", "-k", "100000", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 6 and asked == [6]  # the tenant's 6 nodes, not 100,000 rows
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert said == ["-k 100000 is more than the 6 nodes tenant 'u1' holds: showing at most 6"], said
    caplog.clear()
    with caplog.at_level("WARNING", logger="memforest_gpu"):
        assert main(["search", str(src), "memory 3", "--tenant", "u1", "-k", "4", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 4 and asked[-1] == 4 and not caplog.records


def test_review_pages_take_the_suffixes_the_docs_name(tmp_path, capsys):
    from memforest_gpu.cli.review import check_review

    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "cli.md"), encoding="utf-8") as f:
        doc = " ".join(f.read().split())
    assert "The path must end in `.html` or `.htm` (any case; another suffix is refused in one line)" in doc
    for name in ("p.html", "p.htm", "P.HTM"):
        check_review(str(tmp_path / name))
    src = _jsonl(tmp_path / "in.jsonl")
    for name in ("p.txt", "p.html.bak", "p"):
        assert main(["compress", src, str(tmp_path / "o.jsonl"), "--review", str(tmp_path / name),
                     "--embedder", "none", "--quiet"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--review must be an .html file" in err[0], err
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]


def test_report_says_no_node_cap(tmp_path, capsys):
    src = _jsonl(tmp_path / "in.jsonl")
    assert main(["compress", src, str(tmp_path / "o.jsonl"), "--embedder", "none", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "no node cap" in out and "none tokens" not in out


def test_iso_timestamps_round_trip_as_iso(tmp_path, capsys):
    from datetime import datetime

    from memforest_gpu.store.timeutil import parse_timestamp

    def iso(i):
        return datetime.fromtimestamp(1.7e9 + 3600 * i, tz=UTC).isoformat()

    src = _jsonl(tmp_path / "in.jsonl", ts=iso)
    out = tmp_path / "out.jsonl"
    assert main(["compress", src, str(out), "--embedder", "none", "--quiet"]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
    rows = [r for r in rows if "id" in r]
    assert all(isinstance(r["timestamp"], str) and "T" in r["timestamp"] for r in rows)
    src_ts = {f"m{i}": parse_timestamp(iso(i)) for i in range(24)}
    for r in rows:  # a merged node keeps its newest original's time
        assert parse_timestamp(r["timestamp"]) == max(src_ts[s] for s in r["sources"])
    # epoch input stays epoch
    src2 = _jsonl(tmp_path / "in2.jsonl")
    assert main(["compress", src2, str(tmp_path / "o2.jsonl"), "--embedder", "none", "--quiet"]) == 0
    rows2 = [json.loads(x) for x in (tmp_path / "o2.jsonl").read_text().splitlines()]
    assert all(isinstance(r["timestamp"], float) for r in rows2 if "id" in r)


def test_docs_document_the_jsonl_header_line():
    readme = open(os.path.join(os.path.dirname(__file__), "..", "docs", "cli.md"), encoding="utf-8").read()
    assert '{"__memforest__": {"embedder":' in readme


def test_no_progress_bars_when_stderr_is_not_a_terminal(tmp_path):
    src = _jsonl(tmp_path / "in.jsonl", embed=False)
    res = subprocess.run([sys.executable, "-m", "memforest_gpu.cli", "compress", src, str(tmp_path / "o.jsonl")],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "%|" not in res.stderr and "Loading weights" not in res.stderr, res.stderr


def test_eval_export_refuses_the_benchmark_folder(tmp_path, capsys):
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "nodes.jsonl").write_text('{"id": "a", "text": "x", "timestamp": 1}\n')
    (bench / "questions.jsonl").write_text("")
    before = sorted(os.listdir(bench))
    assert main(["eval", "--benchmark", str(bench), "--export", str(bench)]) == 2
    assert "--export's nodes.jsonl must not be the input file" in capsys.readouterr().err
    assert sorted(os.listdir(bench)) == before


def test_an_input_named_like_the_lock_or_journal_is_never_touched(tmp_path, capsys):
    for side in (".lock", ".journal.jsonl"):
        src = _jsonl(tmp_path / f"out.jsonl{side}")
        before = open(src, "rb").read()
        os.utime(src, (0, 0))  # old: a stale-lock check must not take it for an abandoned lock
        assert main(["compress", src, str(tmp_path / "out.jsonl"), "--embedder", "none", "--quiet",
                     "--format", "jsonl"]) == 2
        assert "must not be the input file" in capsys.readouterr().err
        assert open(src, "rb").read() == before
        os.unlink(src)


def test_graph_compress_keeps_a_graphs_own_vectors(tmp_path, capsys, caplog, model_loads):
    g = tmp_path / "g.jsonl"
    rng = np.random.default_rng(0)
    g.write_text("".join(json.dumps({"kind": "node", "id": f"n{i}", "text": f"Node {i} about {i % 3}.",
                                     "timestamp": 1.7e9 + i, "embedding": rng.standard_normal(8).tolist()}) + "\n"
                         for i in range(12)))
    with caplog.at_level("WARNING", logger="memforest_gpu"):
        rc = main(["graph", "compress", str(g), str(tmp_path / "o.jsonl"), "--quiet"])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    assert "embedder mean-of-inputs" in cap.out and model_loads == []
    assert sum("--embedder PATH" in r.getMessage() for r in caplog.records) == 1


def test_mem0_backup_and_report_never_overwrite_the_config(tmp_path, capsys):
    cfg = tmp_path / "mem0.yaml"
    cfg.write_text("vector_store: {provider: qdrant}\n")
    before = cfg.read_bytes()
    for extra in (["--backup", str(cfg)], ["--report", str(cfg)]):
        assert main(["mem0", "compress", "--config", str(cfg), "--user-id", "u"] + extra) == 2
        assert "must not be the input file" in capsys.readouterr().err
    assert cfg.read_bytes() == before


@pytest.mark.parametrize("cmd", [["info"], ["search", "--embedder", "default"]])
def test_unknown_suffix_errors_suggest_no_missing_flag(tmp_path, capsys, cmd):
    odd = tmp_path / "store.csv"
    odd.write_text("id,text\n")
    args = [cmd[0], str(odd)] + (["query"] + cmd[1:] if cmd[0] == "search" else [])
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "cannot tell the format" in err and "format=" not in err and "--format" not in err, err
