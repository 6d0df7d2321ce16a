"""Notes for a person watching a run, such as how long a model took to load: logged at INFO on
the ``memforest_gpu.notes`` logger. The command line prints them on stderr as they are unless
``--quiet``; a program sees them with its INFO logging."""
from __future__ import annotations

import contextlib
import logging
import time

__all__ = ["NOTES", "SLOW_LOAD_S", "timed_load"]

NOTES = "memforest_gpu.notes"  # the logger's name
SLOW_LOAD_S = 2.0  # a load that takes longer is noted

log = logging.getLogger(NOTES)


@contextlib.contextmanager
def timed_load(what: str):
    """Time the load of ``what`` (``the embedder all-MiniLM-L6-v2``); when it took longer than
    :data:`SLOW_LOAD_S`, note ``loading the embedder all-MiniLM-L6-v2 (12.3 s)`` once it is done."""
    t0 = time.perf_counter()
    yield
    seconds = time.perf_counter() - t0
    if seconds > SLOW_LOAD_S:
        log.info("loading %s (%.1f s)", what, seconds)
