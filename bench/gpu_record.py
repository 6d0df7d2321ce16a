"""Records of the GPU verification run: one JSON object per line, appended and flushed the
moment a result exists, so a step killed at its time limit loses only what it had not
written yet.

Every record has the same keys first, then its own figures::

    {"step": "kmeans", "name": "assign_triton", "status": "ok", "summary": "...",
     "device": "NVIDIA H200", "rehearse": false, "time": "2026-12-01T00:00:00Z", ...figures}

``status``: ok | fail (ran, wrong or refused) | error (crashed) | timeout | skipped.
"""
from __future__ import annotations

import argparse
import json
import os
import time

__all__ = ["RECORDS", "STATUSES", "append_record", "read_records", "summary_table"]

RECORDS = "gpu_records.jsonl"
STATUSES = ("ok", "fail", "error", "timeout", "skipped")
COMMON = ("step", "name", "status", "summary", "device", "rehearse", "time")


def append_record(path: str, *, step: str, name: str, status: str = "ok", summary: str = "", device: str = "",
                  rehearse: bool = False, **figures) -> dict:
    """Append one record to ``path`` (JSONL) and flush it to disk; returns the record."""
    if status not in STATUSES:
        raise ValueError(f"status must be one of {list(STATUSES)}, got {status!r}")
    rec = {"step": step, "name": name, "status": status, "summary": summary, "device": device,
           "rehearse": bool(rehearse), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **figures}
    line = json.dumps(rec, default=_plain)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())
    print(f"[{step}] {name}: {status}  {summary}", flush=True)
    return rec


def _plain(x):
    """JSON for numpy / torch scalars and other odd values."""
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, (set, tuple)):
        return list(x)
    return str(x)


def read_records(path: str) -> list[dict]:
    """The records of ``path``; a torn last line (a step killed mid-write) is skipped."""
    if not os.path.exists(path):
        return []
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def summary_table(records: list[dict]) -> str:
    """One line per record: step, name, status, summary."""
    rows = [("step", "name", "status", "summary")]
    rows += [(r.get("step", "?"), r.get("name", "?"), r.get("status", "?"), r.get("summary", "")) for r in records]
    w = [max(len(str(r[i])) for r in rows) for i in range(3)]
    lines = [f"{a:<{w[0]}}  {b:<{w[1]}}  {c:<{w[2]}}  {d}" for a, b, c, d in rows]
    lines.insert(1, "-" * min(120, sum(w) + 6 + max(len(str(r[3])) for r in rows)))
    return "\n".join(lines)


if __name__ == "__main__":  # a module the benchmarks import: run alone, it only explains itself
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog="Imported by other bench/ scripts (bench/README.md); it runs nothing "
                                   "by itself.").parse_args()
