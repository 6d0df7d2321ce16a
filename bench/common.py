"""Shared bits of the benchmark scripts: hardware line, timing, JSON output."""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import time

import torch

__all__ = ["hardware", "sync", "Timer", "peak_rss_mb", "reset_peak", "write_records", "print_hardware", "run_measured"]


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


def run_measured(cmd: list[str], *, env: dict | None = None) -> dict:
    """Run ``cmd`` as a child process; return its wall ``seconds``, whole-process
    ``peak_rss_mb`` (``/usr/bin/time -v``'s "Maximum resident set size" when that tool
    exists, else ``getrusage(RUSAGE_CHILDREN)``, the largest child so far), ``peak_source``,
    ``returncode`` and the tail of its output."""
    import re
    import shutil
    import subprocess

    timer = "/usr/bin/time" if os.path.exists("/usr/bin/time") else shutil.which("time")
    full = [timer, "-v", *cmd] if timer else list(cmd)
    t = time.perf_counter()
    p = subprocess.run(full, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - t
    peak, source = None, None
    if timer:
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr)
        if m:
            peak, source = int(m.group(1)) / 1024.0, "time -v"
    if peak is None:
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0
        source = "getrusage(RUSAGE_CHILDREN)"
    tail = (p.stdout + p.stderr)[-3000:]
    return {"seconds": seconds, "peak_rss_mb": peak, "peak_source": source, "returncode": p.returncode,
            "output_tail": tail, "output": p.stdout + p.stderr}


if __name__ == "__main__":  # a module the benchmarks import: run alone, it only explains itself
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog="Imported by other bench/ scripts (bench/README.md); it runs nothing "
                                   "by itself.").parse_args()
