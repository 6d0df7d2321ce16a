"""Wall seconds per stage of a run: one clock for the engine, ``compact`` and the adapters.

    timer = StageTimer()
    with timer.stage("partition"):      # adds the block's seconds to "partition"
        ...
    timer.lap("read")                   # adds the seconds since the last stage or lap to "read"
    seconds = timer.finish()            # {"partition": ..., "read": ..., "total": since creation}

A stage may be entered many times (one per round): its seconds add up.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

__all__ = ["StageTimer"]


class StageTimer:
    """Seconds per stage (``seconds``), and the run's total once :meth:`finish` is called."""

    def __init__(self, stages: tuple[str, ...] = ()):
        self.seconds: dict[str, float] = {s: 0.0 for s in stages}  # stages listed first, in this order
        self._start = self._last = time.perf_counter()

    def add(self, stage: str, seconds: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds

    @contextmanager
    def stage(self, name: str):
        """Adds the seconds the block takes to ``name``."""
        t = time.perf_counter()
        try:
            yield
        finally:
            self._last = time.perf_counter()
            self.add(name, self._last - t)

    def lap(self, name: str) -> None:
        """Adds the seconds since the last stage ended (or the last lap, or the start) to
        ``name``."""
        now = time.perf_counter()
        self.add(name, now - self._last)
        self._last = now

    def elapsed(self) -> float:
        """The wall seconds since the timer started (a progress line's clock; finishes nothing)."""
        return time.perf_counter() - self._start

    def finish(self) -> dict[str, float]:
        """The seconds per stage with ``total``: the wall time since the timer started."""
        self.seconds["total"] = time.perf_counter() - self._start
        return self.seconds
