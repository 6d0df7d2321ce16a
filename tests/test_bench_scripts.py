"""Every script of bench/ and of docs/studies/scripts/ (the study scripts, beside their pages) still
runs: ``python bench/X.py --help`` (``bash bench/X.sh --help``) exits 0 and prints its usage. A
script whose import broke (a helper renamed in the package) fails here, not the day a published
study is rendered again. The scripts run two at a time (each imports torch), once for the whole module."""
from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("bench", "docs/studies/scripts")
SCRIPTS = sorted(f"{d}/{p.name}" for d in FOLDERS for p in (ROOT / d).iterdir() if p.suffix in (".py", ".sh"))


def _help(name: str) -> subprocess.CompletedProcess:
    cmd = ["bash" if name.endswith(".sh") else sys.executable, str(ROOT / name), "--help"]
    env = dict(os.environ, PYTHON=sys.executable)  # gpu.sh runs $PYTHON
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@cache
def _all() -> dict[str, subprocess.CompletedProcess]:
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(SCRIPTS, pool.map(_help, SCRIPTS)))


def test_bench_holds_scripts():
    assert {"bench/compare.py", "bench/results.py", "bench/gpu.sh"} <= set(SCRIPTS)
    assert "docs/studies/scripts/merged_keys.py" in SCRIPTS


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_runs(name):
    r = _all()[name]
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"{name} --help exited {r.returncode}:\n{out[-3000:]}"
    assert "usage" in r.stdout.lower(), f"{name} --help printed no usage:\n{out[-3000:]}"
