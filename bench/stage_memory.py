"""Memory and time by stage of one ``memforest`` command, measured inside its own process.

    python bench/stage_memory.py --out stages.json -- compress IN OUT --preset paper --embedder none

runs ``memforest_gpu.cli.commands(argv)`` in this process with a background sampler of the
resident set (``/proc/self/statm`` every ``--interval`` seconds) and marks at the stage
boundaries of a compression:

    startup -> read -> prepare -> partition -> setup -> trees -> rounds -> output -> report -> write -> exit

and inside every merge round ``r.plan`` (planning) -> ``r.pairs`` (the merger's inputs) ->
``r.merge`` (the merger) -> ``r.vectors`` (the merged vectors, the node table) -> ``r.apply``
(the trees) -> ``r.records`` (the round's records, until the next round), then ``keys`` (the
output's keys, made before the output is assembled; so ``rounds`` is only the start of the first
round, and each ``r.`` stage's peak is its largest over the rounds).

``read`` is ``load_store_and_embedder``, ``prepare`` what the API does before ``compress``
(the journal's fingerprint), ``partition`` ``partition_nodes``, ``setup`` the quotas and
token counts, ``trees`` ``build_trees``, ``rounds`` the merge rounds (split as above), ``output``
``assemble``, ``report`` the run report, ``write`` ``write_store``. The marks wrap those
functions where the API and the engine call them (a renamed one fails loudly here, never
silently). A run with ``--memory-budget`` passes through the engine's stages once per
group (a stage's seconds add up, its peaks are the largest); its reads and writes of the
groups' parts fall in ``report``.

Per stage: seconds, resident set at its start and end, the largest sampled within it, and
the process's high-water mark (``VmHWM``) at its end, so the stage where the high-water mark
rose last is the one that set the whole-process peak. On CUDA also the peak device memory
(``torch.cuda.max_memory_allocated``, reset at every mark) and what is allocated at its end.
Marks also go to stderr as they pass (``# stage NAME rss ... MB``) unless ``--quiet-marks``.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import threading
import time
from contextlib import contextmanager

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import peak_rss_mb as hwm_mb  # noqa: E402  the resident high-water mark (VmHWM)

__all__ = ["StageMemory", "stage_marks", "rss_mb", "hwm_mb", "main"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
MB = 1024.0 * 1024.0


def rss_mb() -> float:
    """Resident set of this process now (MB)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE / MB
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _cuda():
    import torch

    return torch.cuda if torch.cuda.is_available() and torch.cuda.is_initialized() else None


class StageMemory:
    """Sampler thread plus stage marks; :meth:`mark` ends the current stage and starts ``name``."""

    def __init__(self, interval: float = 0.01, echo: bool = True):
        self.interval, self.echo = interval, echo
        self.stages: dict[str, dict] = {}
        self.order: list[str] = []
        self._lock = threading.Lock()
        self._name, self._t, self._peak, self._start = "startup", time.perf_counter(), rss_mb(), rss_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="stage-memory", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.mark("exit")
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            r = rss_mb()
            with self._lock:
                self._peak = max(self._peak, r)

    def mark(self, name: str) -> None:
        now, r, hwm = time.perf_counter(), rss_mb(), hwm_mb()
        cuda = _cuda()
        with self._lock:
            prev = self.stages.get(self._name)
            rec = {"seconds": now - self._t, "rss_start_mb": self._start, "rss_end_mb": r,
                   "rss_peak_mb": max(self._peak, r), "hwm_end_mb": hwm, "passes": 1}
            if cuda is not None:
                rec["cuda_peak_mb"] = cuda.max_memory_allocated() / MB
                rec["cuda_end_mb"] = cuda.memory_allocated() / MB
            if prev is None:
                self.stages[self._name] = rec
                self.order.append(self._name)
            else:  # a stage passed again (one compression per budget group): add times, keep peaks
                prev["seconds"] += rec["seconds"]
                prev["passes"] += 1
                prev["rss_end_mb"], prev["hwm_end_mb"] = rec["rss_end_mb"], rec["hwm_end_mb"]
                for k in ("rss_peak_mb", "cuda_peak_mb"):
                    if k in rec:
                        prev[k] = max(prev.get(k, 0.0), rec[k])
                if "cuda_end_mb" in rec:
                    prev["cuda_end_mb"] = rec["cuda_end_mb"]
            if self.echo:
                print(f"# stage {self._name:<9} {rec['seconds']:8.2f}s  rss {self._start:7.0f} -> {r:7.0f} MB, "
                      f"peak {rec['rss_peak_mb']:7.0f} MB, hwm {hwm:7.0f} MB"
                      + (f", cuda peak {rec['cuda_peak_mb']:.0f} MB" if "cuda_peak_mb" in rec else ""),
                      file=sys.stderr, flush=True)
            self._name, self._t, self._peak, self._start = name, now, r, r
        if cuda is not None:
            cuda.reset_peak_memory_stats()

    def summary(self) -> dict:
        """Stages in the order first seen, and the whole process's high-water mark."""
        return {"stages": {n: self.stages[n] for n in self.order}, "hwm_mb": hwm_mb(),
                "peak_stage": self.peak_stage()}

    def peak_stage(self) -> str | None:
        """The stage during which the high-water mark reached its final value."""
        best, last = None, 0.0
        for n in self.order:
            h = self.stages[n]["hwm_end_mb"]
            if h > last + 1.0:
                best, last = n, h
        return best


# (modules where the caller looks the function up, newest first; function; stage started on
# entry; stage started on exit). The first module that has the function is patched, so the
# marks also work on older revisions (bench/compare.py runs this script against them).
MARKS = (
    (("memforest_gpu.runs.single", "memforest_gpu.api"), "load_store_and_embedder", "read", "prepare"),
    (("memforest_gpu.runs.single", "memforest_gpu.api"), "write_store", "write", "exit"),
    (("memforest_gpu.engine.compression", "memforest_gpu.engine.compression"), "partition_nodes", "partition", "setup"),
    (("memforest_gpu.engine.compression", "memforest_gpu.engine.compression"), "build_trees", "trees", "rounds"),
    (("memforest_gpu.engine.compression",), "assemble", "output", "report"),
    # inside every merge round (a stage's peak is its largest over the rounds), and the keys
    (("memforest_gpu.engine.compression",), "plan_round", "r.plan", "r.pairs"),
    (("memforest_gpu.engine.compression",), "merge_texts", "r.merge", "r.vectors"),
    (("memforest_gpu.engine.compression",), "apply_round", "r.apply", "r.records"),
    (("memforest_gpu.engine.compression",), "output_keys", "keys", None),
)


def _lookup(modules: tuple[str, ...], fn: str):
    """The first of ``modules`` that exists and has ``fn``; a rename everywhere fails loudly."""
    import importlib

    for name in modules:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        if hasattr(mod, fn):
            return mod
    raise AttributeError(f"none of {list(modules)} has {fn!r}: update bench/stage_memory.MARKS")


@contextmanager
def stage_marks(sm: StageMemory):
    """Within the block, the functions of :data:`MARKS` mark ``sm`` where their callers look
    them up; they are restored afterwards."""
    saved = []
    try:
        for modules, fn, enter, leave in MARKS:
            mod = _lookup(modules, fn)
            f = getattr(mod, fn)

            def wrapped(*a, _f=f, _enter=enter, _leave=leave, **k):
                if _enter:
                    sm.mark(_enter)
                try:
                    return _f(*a, **k)
                finally:
                    if _leave:
                        sm.mark(_leave)

            saved.append((mod, fn, f))
            setattr(mod, fn, functools.wraps(f)(wrapped))
        yield sm
    finally:
        for mod, fn, f in reversed(saved):
            setattr(mod, fn, f)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file for the stages")
    ap.add_argument("--interval", type=float, default=0.01, help="seconds between samples")
    ap.add_argument("--quiet-marks", action="store_true", help="no '# stage' lines on stderr")
    ap.add_argument("cli", nargs=argparse.REMAINDER, help="-- then the memforest arguments")
    a = ap.parse_args(argv)
    args = a.cli[1:] if a.cli[:1] == ["--"] else a.cli
    sm = StageMemory(a.interval, echo=not a.quiet_marks)
    try:
        from memforest_gpu.cli.commands import main as cli_main
    except ImportError:  # an older revision (bench/compare.py)
        from memforest_gpu.cli.main import main as cli_main

    with sm, stage_marks(sm):
        rc = cli_main(args)
    with open(a.out, "w") as f:
        json.dump({"argv": args, "returncode": rc, **sm.summary()}, f, indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
