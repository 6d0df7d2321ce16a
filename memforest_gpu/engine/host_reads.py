"""Count device→host reads: the synchronisation budget made checkable on a CPU.

On a GPU every read of a tensor's value by the host (``.item()``, ``.tolist()``, ``.cpu()``,
``if t:``, ``int(t)``, ``t.nonzero()``, ...) waits for the device. The engine keeps a budget of
such reads per merge round; :func:`count_host_reads` wraps those entry points for the
duration of a ``with`` block and counts every call, whatever device the tensor is on, so a
CPU test sees the same count a CUDA run would (on a GPU,
``torch.cuda.set_sync_debug_mode("warn")`` shows the same reads as warnings).

>>> with count_host_reads() as reads:
...     compress(store)
>>> reads.total, reads.by_name

What is counted: the calls below made from Python. Operations whose output size depends
on the data (``torch.unique``, boolean-mask indexing) also synchronise on CUDA; the ones
listed in ``_TORCH_FUNCS`` are counted as well. Reads made inside torch's C++ code are not
seen, and ``.to("cpu")`` is not counted (on a CPU run it is indistinguishable from a
host→device copy).
"""
from __future__ import annotations

import threading
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

__all__ = ["count_host_reads", "HostReads"]

# Tensor.unique and Tensor.__array__ go through torch.unique / Tensor.numpy, counted once there
_TENSOR_METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__",
                   "nonzero", "argwhere", "masked_select")
_TORCH_FUNCS = ("nonzero", "argwhere", "unique", "unique_consecutive", "masked_select")
_lock = threading.Lock()


@dataclass
class HostReads:
    """Counts of host reads by entry point; ``total`` is their sum."""

    by_name: Counter = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.by_name.values())

    def snapshot(self) -> int:
        return self.total


@contextmanager
def count_host_reads():
    """Count host reads inside the block (not re-entrant; one counter at a time).

    ``t.any()`` is not a read by itself; ``if t.any():`` is, counted once as ``__bool__``.
    """
    if not _lock.acquire(blocking=False):
        raise RuntimeError("count_host_reads is already active; nest the measured code instead")
    reads = HostReads()
    saved: list[tuple[object, str, object]] = []

    def wrap(owner, name, label):
        orig = getattr(owner, name)

        def counted(*args, **kwargs):
            reads.by_name[label] += 1
            return orig(*args, **kwargs)

        counted.__wrapped__ = orig
        saved.append((owner, name, orig))
        setattr(owner, name, counted)

    try:
        for name in _TENSOR_METHODS:
            wrap(torch.Tensor, name, f"Tensor.{name}")
        for name in _TORCH_FUNCS:
            wrap(torch, name, f"torch.{name}")
        yield reads
    finally:
        for owner, name, orig in reversed(saved):
            setattr(owner, name, orig)
        _lock.release()
