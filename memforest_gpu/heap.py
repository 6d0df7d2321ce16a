"""Freed host memory handed back to the system between stages.

glibc's malloc serves a request below its mmap threshold from the heap, and raises that
threshold (up to 32 MiB) each time a larger mapped block is freed; after the first stages most
of torch's and NumPy's CPU blocks come from the heap, and their pages stay resident once freed
until ``malloc_trim``. Arrow's own pool (mimalloc or jemalloc) keeps its freed buffers too,
until ``release_unused``. A run calls :func:`release_free_heap` between stages and merge rounds
(docs/performance.md: what it saves, and what it costs). Elsewhere than glibc only Arrow's pool
is released. Read-only file mappings registered with :func:`register_mapping` (a store's mapped
texts, :mod:`memforest_gpu.store.mapped_texts`) hand their resident pages back at the same calls.
"""
from __future__ import annotations

import ctypes
import mmap
import sys
import weakref

__all__ = ["release_free_heap", "register_mapping", "release_mappings"]

_MAPPINGS: weakref.WeakSet = weakref.WeakSet()  # read-only file mappings whose pages are handed back

_trim = None  # glibc's malloc_trim once looked up; False where there is none


def release_free_heap(min_free: int = 0) -> bool:
    """Give the free pages of the C heap back to the system (``malloc_trim(0)``): a scan of the
    allocator's free lists, milliseconds; and Arrow's pool's, where pyarrow is loaded. With
    ``min_free``, the C heap is trimmed only when its free blocks (``mallinfo2``, resident or
    not) add up to at least that many bytes: a small run's many rounds skip the scan. Returns
    whether the C heap was trimmed."""
    global _trim
    release_mappings()
    arrow = sys.modules.get("pyarrow")  # Arrow's own pool (mimalloc or jemalloc) keeps freed buffers too
    if arrow is not None:
        arrow.default_memory_pool().release_unused()
    if _trim is None:
        _trim = _lookup()
    if _trim is False:
        return False
    if min_free and _free_bytes() < min_free:
        return False
    _trim(0)
    return True


def register_mapping(mm: mmap.mmap) -> None:
    """Hand ``mm``'s resident pages back at every :func:`release_free_heap` while it lives: a
    read-only mapping of a file, whose pages the kernel reads again where they are touched."""
    _MAPPINGS.add(mm)


def release_mappings() -> None:
    """Hand the resident pages of every registered mapping back (:func:`register_mapping`)."""
    for mm in list(_MAPPINGS):
        if not mm.closed and hasattr(mm, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            mm.madvise(mmap.MADV_DONTNEED)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


_info = None  # glibc's mallinfo2 once looked up; False where there is none (glibc < 2.33)


def _free_bytes() -> float:
    """Bytes in the C heap's free blocks (``mallinfo2().fordblks``); +inf where unreadable."""
    global _info
    if _info is None:
        try:
            _info = ctypes.CDLL(None).mallinfo2
            _info.restype = _MallInfo2
        except (OSError, AttributeError):
            _info = False
    return float(_info().fordblks) if _info else float("inf")


def _lookup():
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None).malloc_trim  # the process's own C library (musl has none)
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn
