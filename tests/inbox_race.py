"""Appends to a store's inbox while it is compacted again and again: no line may be lost.

A writer (a thread, or a separate process for true parallelism) appends one record a line,
each line in one write to the inbox opened for appending and closed again, as
``echo '{...}' >> STORE.inbox.jsonl`` does, every ``--interval`` seconds. Meanwhile the store is
compacted ``--compactions`` times (budget below its size, so every run merges). Then the writer
stops, one last compaction folds what is left, and every id the writer wrote must be in
exactly one node's sources. Prints one line of counts; exits 1 if a line was lost.

    python tests/inbox_race.py --compactions 10 --interval 0.002 --nodes 450 --writer process
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from compact_helpers import arrivals, store_of  # noqa: E402

from memforest_gpu.config import CompactConfig, CompressConfig  # noqa: E402
from memforest_gpu.runs.compact_run import compact_file  # noqa: E402
from memforest_gpu.runs.inbox_files import inbox_files, inbox_path  # noqa: E402
from memforest_gpu.store.io import read_store, write_store  # noqa: E402

_WRITER = """
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from compact_helpers import arrivals
path, interval, stop, cap = sys.argv[2], float(sys.argv[3]), sys.argv[4], int(sys.argv[5])
templates = arrivals(100, 1, ["a", "b", "c"])
k = 0
while not os.path.exists(stop) and (cap == 0 or k < cap):
    r = dict(templates[k % 3], id=f"w-{k}", text=f"Appended memory number {k}.")
    line = (json.dumps(r) + "\\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, line)
    os.close(fd)
    k += 1
    time.sleep(interval)
print(k)
"""


def _thread_writer(path: str, interval: float, stop: threading.Event, out: list, cap: int) -> None:
    templates = arrivals(100, 1, ["a", "b", "c"])
    k = 0
    while not stop.is_set() and (cap == 0 or k < cap):
        r = dict(templates[k % 3], id=f"w-{k}", text=f"Appended memory number {k}.")
        line = (json.dumps(r) + "\n").encode()
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, line)
        os.close(fd)
        k += 1
        time.sleep(interval)
    out.append(k)


def race(folder: str, *, nodes: int = 450, compactions: int = 10, interval: float = 0.002, writer: str = "thread",
         fmt: str = "parquet", max_lines: int = 0) -> dict:
    """Run the race in ``folder``; returns the counts (``lost``: ids written but in no node).
    ``max_lines``: the writer stops after that many lines (0: when the compactions end)."""
    path = os.path.join(folder, f"store.{fmt}")
    per = nodes // 3
    write_store(store_of(arrivals(0, per, ["a", "b", "c"])), path)
    budget = CompactConfig(max_nodes=per, low_water=0.8)  # every run brings the tenants back under their budget
    cfg = CompressConfig.preset("memforest")
    stop_file = os.path.join(folder, "stop")
    if writer == "process":
        env = {**os.environ, "PYTHONPATH": os.path.dirname(HERE) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, HERE, inbox_path(path), str(interval), stop_file,
                                 str(max_lines)],
                                stdout=subprocess.PIPE, text=True, env=env)
    else:
        stop, out = threading.Event(), []
        th = threading.Thread(target=_thread_writer, args=(inbox_path(path), interval, stop, out, max_lines))
        th.start()
    deadline = time.monotonic() + 60
    while not os.path.exists(inbox_path(path)) and time.monotonic() < deadline:  # the writer has started
        time.sleep(0.01)
    folded = 0
    try:
        for _ in range(compactions):
            folded += compact_file(path, budget, cfg, embedder="none").inbox
    finally:
        if writer == "process":
            open(stop_file, "w").close()
            written = int(proc.communicate(timeout=60)[0].strip())
        else:
            stop.set()
            th.join()
            written = out[0]
    folded += compact_file(path, budget, cfg, embedder="none").inbox
    ids = [x for s in read_store(path).sources for x in s]
    got = {x for x in ids if x.startswith("w-")}
    return {"written": written, "folded": folded, "in_store": len(got), "lost": written - len(got),
            "twice": len(ids) - len(set(ids)), "inbox_files_left": len(inbox_files(path)),
            "compactions": compactions + 1}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=450, help="memories in the store (three tenants)")
    ap.add_argument("--compactions", type=int, default=10)
    ap.add_argument("--interval", type=float, default=0.002, help="seconds between two appends")
    ap.add_argument("--writer", choices=["thread", "process"], default="process")
    ap.add_argument("--format", choices=["parquet", "jsonl"], default="parquet")
    ap.add_argument("--max-lines", type=int, default=0, help="the writer stops after this many lines (0: never)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        r = race(d, nodes=a.nodes, compactions=a.compactions, interval=a.interval, writer=a.writer, fmt=a.format,
                 max_lines=a.max_lines)
    print(json.dumps({"format": a.format, "writer": a.writer, **r}))
    return 1 if r["lost"] or r["twice"] or r["written"] != r["folded"] else 0


if __name__ == "__main__":
    sys.exit(main())
