"""A command line that answers at once: a usage error (a missing file, a bad flag value, a
missing ``--tenant``) and ``--help`` are answered before torch or a model is loaded, in under a
second from a fresh interpreter; a slow model load is said on stderr, unless ``--quiet``."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

import memforest_gpu

LIMIT_S = 1.0  # a usage error's answer, interpreter start included


def _answer(code: str, *args: str) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)
    return time.perf_counter() - t0, r


#: runs ``memforest ARGV`` in this fresh interpreter, then prints its exit status and whether
#: torch was imported
RUN = ("import json, sys\nfrom memforest_gpu.cli import main\ntry:\n    rc = main(sys.argv[1:])\n"
       "except SystemExit as e:\n    rc = e.code\nprint(json.dumps({'rc': rc, 'torch': 'torch' in sys.modules}))")


def _fastest(*argv: str, tries: int = 3) -> tuple[float, dict, str]:
    """The fastest of a few answers (a loaded machine delays one now and then), its outcome and
    its stderr."""
    best = None
    for _ in range(tries):
        s, r = _answer(RUN, *argv)
        assert r.returncode == 0, r.stderr
        if best is None or s < best[0]:
            best = (s, json.loads(r.stdout.strip().splitlines()[-1]), r.stderr)
    return best


@pytest.mark.parametrize("argv, says", [
    (["search", "/nonexistent/store.parquet", "q"], "memory store file not found: '/nonexistent/store.parquet'"),
    (["compress", "{sample}", "{tmp}/out.jsonl", "--ratio", "2"], "--ratio must be in (0.0, 1.0), got 2.0"),
    (["compress", "{sample}", "{tmp}/out.jsonl", "--keys", "-3"], "argument --keys: must be an integer >= 0"),
    (["compress", "{sample}", "{tmp}/out.jsonl", "--memory-budget", "lots"], "--memory-budget must be a size"),
    (["search", "{sample}", "q", "-k", "0"], "-k must be an integer >= 1, got 0"),
    (["info", "/nonexistent/store.jsonl"], "memory store file not found"),
    (["compact", "/nonexistent/s.jsonl", "--max-nodes-per-tenant", "10"], "memory store file not found"),
    (["demo", "--ratio", "1.5"], "--ratio must be in (0.0, 1.0), got 1.5"),
])
def test_a_usage_error_is_answered_in_under_a_second_without_torch(tmp_path, argv, says):
    sample = Path(memforest_gpu.__file__).parent / "data" / "sample_memories.jsonl"
    argv = [a.format(sample=sample, tmp=tmp_path) for a in argv]
    seconds, out, err = _fastest(*argv)
    assert out == {"rc": 2, "torch": False}, err
    assert says in err and err.count("\n") == 1, err
    assert seconds < LIMIT_S, f"{argv}: answered in {seconds:.2f} s"


def test_a_parquet_store_of_several_tenants_needs_tenant_before_anything_loads(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "s.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c"], "text": ["x", "y", "z"], "timestamp": [1.0, 2.0, 3.0],
                             "tenant": ["bob", "alice", "bob"]}), path)
    seconds, out, err = _fastest("search", str(path), "where?")
    assert out == {"rc": 2, "torch": False}, err
    assert "--tenant must be given for a store with several tenants, one of ['bob', 'alice']" in err, err
    assert seconds < LIMIT_S, f"answered in {seconds:.2f} s"


def test_one_tenant_by_the_footer_and_several_by_the_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from memforest_gpu.cli.tenants import UNNAMED, parquet_tenants
    from memforest_gpu.store.column_checks import DEFAULT_TENANT

    assert UNNAMED == DEFAULT_TENANT
    one, none, mixed = tmp_path / "one.parquet", tmp_path / "none.parquet", tmp_path / "mixed.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "tenant": ["bob", "bob"]}), one, row_group_size=1)
    pq.write_table(pa.table({"id": ["a", "b"]}), none)
    pq.write_table(pa.table({"id": ["a", "b", "c"], "tenant": ["bob", None, ""]}), mixed)
    assert parquet_tenants(str(one)) is None and parquet_tenants(str(none)) is None
    assert parquet_tenants(str(mixed)) == ["bob", UNNAMED]


def test_every_help_answers_without_torch():
    code = ("import sys, contextlib, io\nfrom memforest_gpu.cli import main\n"
            "for argv in [[], ['compress'], ['search'], ['info'], ['demo'], ['compact'], ['mem0', 'compress'],\n"
            "             ['mem0', 'compact'], ['mem0', 'restore'], ['graph', 'compress'], ['eval'], ['review']]:\n"
            "    with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            "        try:\n            main(argv + ['--help'])\n        except SystemExit as e:\n"
            "            assert e.code == 0, (argv, e.code)\n"
            "    assert 'usage: memforest' in out.getvalue(), argv\n"
            "assert 'torch' not in sys.modules and 'pyarrow' not in sys.modules, 'loaded for --help'\n"
            "print('ok')")
    seconds, r = _answer(code)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    assert seconds < 3 * LIMIT_S, f"12 helps in {seconds:.2f} s"


def test_a_slow_load_is_said_once_unless_quiet(monkeypatch, capsys):
    import memforest_gpu.notes as notes
    from memforest_gpu.cli.run_notes import show_notes

    monkeypatch.setattr(notes, "SLOW_LOAD_S", -1.0)  # every load is slow
    try:
        show_notes(quiet=False)
        with notes.timed_load("the embedder all-MiniLM-L6-v2"):
            pass
        err = capsys.readouterr().err
        assert err.startswith("loading the embedder all-MiniLM-L6-v2 (") and err.endswith(" s)\n"), err
        assert err.count("\n") == 1
        show_notes(quiet=True)
        with notes.timed_load("the embedder all-MiniLM-L6-v2"):
            pass
        assert capsys.readouterr().err == ""
    finally:
        log = logging.getLogger(notes.NOTES)
        log.handlers, log.propagate = [], True


def test_the_light_copies_of_the_runs_constants_agree():
    """The command line checks flags with constants of light modules before the modules that
    use them load; each must be the one its user applies."""
    from memforest_gpu import config
    from memforest_gpu.kernels import lloyd
    from memforest_gpu.retrieval import context
    from memforest_gpu.store import codes

    assert config.VECTOR_CODES == codes.VECTOR_CODES
    assert config.MIN_CONTEXT_TOKENS == context.MIN_CONTEXT_TOKENS
    assert config.SEEDINGS == lloyd.SEEDINGS
