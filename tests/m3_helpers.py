"""M3-Agent's own code for the tests: the copy in tests/m3_agent/ (``mmagent``: VideoGraph,
process_memories, retrieve; ``build.py``: graphs built clip by clip; ``check.py``: what
M3-Agent sees of a compressed graph), importable in this process or run in another one."""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
import types
from contextlib import contextmanager
from pathlib import Path

M3_DIR = Path(__file__).resolve().parent / "m3_agent"
MODULES = ("mmagent.videograph", "mmagent.memory_processing", "mmagent.memory_processing_qwen", "mmagent.retrieve",
           "mmagent.utils.chat_api")


@contextmanager
def m3_agent(dim: int | None = None):
    """M3-Agent's package imported from tests/m3_agent for the duration, as a namespace:
    ``videograph``, ``retrieve``, ``chat_api`` (``dim``: text vector size, default 3072),
    ``build`` and ``check``. Every ``mmagent`` module is removed afterwards."""
    saved = {k: v for k, v in sys.modules.items() if k == "mmagent" or k.startswith("mmagent.")}
    for k in saved:
        del sys.modules[k]
    sys.path.insert(0, str(M3_DIR))
    try:
        ns = types.SimpleNamespace(**{m.rsplit(".", 1)[1]: importlib.import_module(m) for m in MODULES})
        if dim is not None:
            ns.chat_api.DIM = dim
        for name in ("build", "check"):
            spec = importlib.util.spec_from_file_location(f"m3_agent_{name}", M3_DIR / f"{name}.py")
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            setattr(ns, name, mod)
        yield ns
    finally:
        sys.path.remove(str(M3_DIR))
        for k in [k for k in sys.modules if k == "mmagent" or k.startswith("mmagent.")]:
            del sys.modules[k]
        sys.modules.update(saved)


def run_m3(script: str, *args, check: bool = True) -> subprocess.CompletedProcess:
    """``python tests/m3_agent/SCRIPT ARGS`` in a process of its own that sees only M3-Agent's
    copy (PYTHONPATH=tests/m3_agent, never this checkout)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(M3_DIR)
    p = subprocess.run([sys.executable, str(M3_DIR / script), *map(str, args)], capture_output=True, text=True,
                       env=env, cwd=str(M3_DIR), timeout=600)
    if check and p.returncode not in (0, 1):
        raise AssertionError(f"{script} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p


def m3_report(original, compressed) -> dict:
    """check.py's report, from a process that never imports memforest."""
    p = run_m3("check.py", original, compressed)
    return json.loads(p.stdout)
