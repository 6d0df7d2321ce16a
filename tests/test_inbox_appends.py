"""No append to the inbox is lost while a compaction runs (docs/compaction.md, "The inbox"):
a line appended at any moment of a compaction is folded in by that run or the next, exactly
once. Two ways: a line appended at every file operation a compaction makes (rename, replace,
unlink: the moments where a rewritten inbox used to drop lines), and a writer appending every
millisecond during repeated compactions (tests/inbox_race.py; .ci/run runs it longer)."""
from __future__ import annotations

import json
import os

import pytest
from compact_helpers import arrivals, store_of
from inbox_race import race

from memforest_gpu.config import CompactConfig, CompressConfig
from memforest_gpu.runs.compact_run import compact_file
from memforest_gpu.runs.inbox_files import inbox_files, inbox_path
from memforest_gpu.store.io import read_store, write_store


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_a_line_appended_at_every_file_operation_is_folded_once(tmp_path, monkeypatch, fmt):
    path = str(tmp_path / f"s.{fmt}")
    write_store(store_of(arrivals(0, 40, ["a", "b"])), path)
    with open(inbox_path(path), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in arrivals(1, 15, ["a", "b"]))
    template = arrivals(2, 1, ["a"])[0]
    written: list[str] = []

    def append_one() -> None:
        if len(written) < 40:
            written.append(f"late-{len(written)}")
            with open(inbox_path(path), "a") as f:  # one line, one write, as `echo ... >>` does
                f.write(json.dumps(dict(template, id=written[-1], text=f"Late memory {len(written)}.")) + "\n")

    for name in ("rename", "replace", "unlink"):
        real = getattr(os, name)

        def hooked(*a, _real=real, **kw):
            append_one()  # a writer appends just before the file operation
            return _real(*a, **kw)
        monkeypatch.setattr(os, name, hooked)
    budget = CompactConfig(max_nodes=45, low_water=0.8)
    folded = 0
    for _ in range(20):  # each run's operations append more lines; they stop after 40
        folded += compact_file(path, budget, CompressConfig.preset("paper"), embedder="none").inbox
        if len(written) == 40 and not inbox_files(path):
            break
    monkeypatch.undo()
    assert len(written) == 40 and not inbox_files(path)
    ids = [x for s in read_store(path).sources for x in s]
    assert len(ids) == len(set(ids)) == 80 + 30 + 40  # every original exactly once
    assert set(written) <= set(ids) and folded == 30 + 40


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_a_writer_appending_every_millisecond_during_compactions_loses_nothing(tmp_path, fmt):
    r = race(str(tmp_path), nodes=150, compactions=8, interval=0.001, writer="thread", fmt=fmt)
    assert r["written"] > 50  # the writer ran during the compactions
    assert r["lost"] == 0 and r["twice"] == 0 and r["folded"] == r["written"], r
    assert r["inbox_files_left"] == 0
