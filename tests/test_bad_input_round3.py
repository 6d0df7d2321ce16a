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
