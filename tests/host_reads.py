"""Count device→host reads (and host→device copies): the synchronisation budget made checkable
on a CPU.

On a GPU every read of a tensor's value by the host (``.item()``, ``.tolist()``, ``.cpu()``,
``if t:``, ``int(t)``, ``t.nonzero()``, ...) waits for the device. The engine keeps a budget of
such reads per merge round; :func:`count_host_reads` wraps those entry points for the
duration of a ``with`` block and counts every call, whatever device the tensor is on, so a
CPU test sees the same count a CUDA run would (on a GPU,
``torch.cuda.set_sync_debug_mode("warn")`` shows the same reads as warnings).

>>> with count_host_reads() as reads:
...     compress(store)
>>> reads.total, reads.by_name, reads.copies

What is counted: the calls below made from Python. Operations whose output size depends
on the data (``torch.unique``, boolean-mask indexing) also synchronise on CUDA; the ones
listed in ``_TORCH_FUNCS`` are counted as well. Reads made inside torch's C++ code are not
seen, and ``.to("cpu")`` is not counted as a read (on a CPU run it is indistinguishable from
a host→device copy).

Copies between host and device stall the stream as much as reads do (a copy from pageable
host memory waits for the device), so they are counted too, apart from the reads
(``copies``, ``h2d``), where they really cross: ``torch.as_tensor`` / ``torch.tensor`` of host
data onto a device, ``Tensor.to`` / ``Tensor.cuda`` / ``Tensor.copy_`` from a CPU tensor to a
device tensor (``H2D ...``), and ``Tensor.to`` / ``Tensor.copy_`` back (``D2H ...``). On a CPU
run there are none; a ``meta`` tensor stands for a device one in the tests. Copies made
implicitly by torch (indexing a device tensor with a host array) are not seen.
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
    """Counts of host reads by entry point; ``total`` is their sum. ``copies``: host↔device
    copies by direction and entry point (``"H2D torch.as_tensor"``...); ``h2d`` their
    host→device part."""

    by_name: Counter = field(default_factory=Counter)
    copies: Counter = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.by_name.values())

    @property
    def h2d(self) -> int:
        return sum(v for k, v in self.copies.items() if k.startswith("H2D"))

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

    def wrap_copy(owner, name, direction):
        orig = getattr(owner, name)

        def counted(*args, **kwargs):
            way = direction(*args, **kwargs)
            if way:
                reads.copies[f"{way} {label}"] += 1
            return orig(*args, **kwargs)

        label = f"{'torch' if owner is torch else 'Tensor'}.{name}"
        counted.__wrapped__ = orig
        saved.append((owner, name, orig))
        setattr(owner, name, counted)

    try:
        for name in _TENSOR_METHODS:
            wrap(torch.Tensor, name, f"Tensor.{name}")
        for name in _TORCH_FUNCS:
            wrap(torch, name, f"torch.{name}")
        wrap_copy(torch, "as_tensor", _made_on_device)
        wrap_copy(torch, "tensor", _made_on_device)
        wrap_copy(torch.Tensor, "to", _moved)
        wrap_copy(torch.Tensor, "cuda", lambda t, *a, **k: "H2D" if _on_host(t.device) else None)
        wrap_copy(torch.Tensor, "copy_", lambda dst, src, *a, **k: _way(src.device, dst.device)
                  if isinstance(src, torch.Tensor) else None)
        yield reads
    finally:
        for owner, name, orig in reversed(saved):
            setattr(owner, name, orig)
        _lock.release()


def _on_host(dev) -> bool:
    return torch.device(dev).type == "cpu"


def _way(src, dst) -> str | None:
    """``"H2D"``, ``"D2H"`` or ``None`` (no crossing) for a copy from device ``src`` to ``dst``."""
    if _on_host(src) and not _on_host(dst):
        return "H2D"
    if not _on_host(src) and _on_host(dst):
        return "D2H"
    return None


def _made_on_device(data, *args, **kwargs) -> str | None:
    """``torch.as_tensor(data, dtype=, device=)`` / ``torch.tensor(data, ..., device=)``: host data
    (a CPU tensor, an array, a list) put on a device."""
    dev = kwargs.get("device")
    if dev is None:
        return None
    src = data.device if isinstance(data, torch.Tensor) else torch.device("cpu")
    way = _way(src, dev)
    return way if way == "H2D" else None


def _moved(t, *args, **kwargs) -> str | None:
    """``Tensor.to(device | tensor | dtype, ...)``: where it goes, when a device is named."""
    dev = kwargs.get("device")
    if dev is None and args:
        a = args[0]
        dev = a.device if isinstance(a, torch.Tensor) else a if isinstance(a, (str, torch.device, int)) else None
    return None if dev is None else _way(t.device, torch.device("cuda", dev) if isinstance(dev, int) else dev)
