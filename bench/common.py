"""Shared bits of the benchmark scripts: hardware line, timing, JSON output."""
from __future__ import annotations

import json
import os
import platform
import resource
import time

import torch

__all__ = ["hardware", "sync", "Timer", "peak_rss_mb", "write_records", "print_hardware"]


def hardware() -> dict:
    dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "device": dev,
            "torch": torch.__version__, "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d")}


def print_hardware():
    h = hardware()
    print("# " + ", ".join(f"{k}={v}" for k, v in h.items()), flush=True)


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class Timer:
    def __enter__(self):
        sync()
        self.t = time.perf_counter()
        return self

    def __exit__(self, *exc):
        sync()
        self.seconds = time.perf_counter() - self.t


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (MB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def write_records(path: str, records: list[dict]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump([{**hardware(), **r} for r in records], f, indent=1)
    print(f"# wrote {path}", flush=True)
