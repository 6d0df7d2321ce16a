"""Shared bits of the benchmark scripts: hardware line, timing, JSON output."""
from __future__ import annotations

import json
import os
import platform
import resource
import time

import torch

__all__ = ["hardware", "sync", "Timer", "peak_rss_mb", "reset_peak", "write_records", "print_hardware"]


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
    """Peak resident memory of this process (MB) since the start or the last :func:`reset_peak`."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def reset_peak() -> bool:
    """Start a new peak-memory window (Linux: clears VmHWM); False where not supported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def write_records(path: str, records: list[dict]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump([{**hardware(), **r} for r in records], f, indent=1)
    print(f"# wrote {path}", flush=True)
