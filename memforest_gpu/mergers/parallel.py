"""Pure-Python work of a batch spread over the machine's cores.

:func:`map_parts` cuts a batch into contiguous parts: this process does the first while
worker processes do the others, and the results come back in the batch's order. The work
must be a module-level function of (argument, part) with no side effects, so the result
never depends on the split. The workers are forked once, on the first batch large enough
to need them, and live as long as this process; a worker that dies makes the batch run
here instead (the result is the same).
"""
from __future__ import annotations

import logging
import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

__all__ = ["map_parts", "spare_cores"]

log = logging.getLogger("memforest_gpu")
_POOL: dict[int, ProcessPoolExecutor] = {}


def spare_cores() -> int:
    """The cores this process may use beside its own (0 on one core)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(0, n - 1)


def _pool(workers: int) -> ProcessPoolExecutor | None:
    if workers not in _POOL:
        if "fork" not in multiprocessing.get_all_start_methods():
            return None  # a fresh interpreter per worker costs more than the parts save
        _POOL[workers] = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))
    return _POOL[workers]


def map_parts(fn: Callable, arg, items: Sequence, *, workers: int, min_items: int) -> list:
    """``fn(arg, items)`` computed in ``1 + workers`` contiguous parts, concatenated in order;
    in this process alone when ``workers`` is 0 or there are fewer than ``min_items`` items.
    ``fn`` returns one result per item."""
    items = list(items)
    if workers < 1 or len(items) < max(2, min_items) or (pool := _pool(workers)) is None:
        return fn(arg, items)
    size = -(-len(items) // (workers + 1))
    parts = [items[i:i + size] for i in range(0, len(items), size)]
    try:
        futures = [pool.submit(fn, arg, part) for part in parts[1:]]
        out = fn(arg, parts[0])
        for f in futures:
            out.extend(f.result())
        return out
    except BrokenProcessPool as e:
        log.warning("a worker process stopped (%s); merging this batch in the main process", e)
        _POOL.pop(workers, None)
        return fn(arg, items)
