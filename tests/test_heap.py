"""memforest_gpu.heap: freed heap pages go back to the system (glibc), nothing happens elsewhere."""
import ctypes
import sys

import pytest

from memforest_gpu import heap


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def _glibc() -> bool:
    return sys.platform.startswith("linux") and hasattr(ctypes.CDLL(None), "gnu_get_libc_version")


@pytest.mark.skipif(not _glibc(), reason="malloc_trim is glibc's")
def test_freed_heap_blocks_stop_being_resident():
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    size = 64 << 10  # under the mmap threshold: from the heap
    blocks = [libc.malloc(size) for _ in range(3000)]  # ~190 MB
    for b in blocks:
        libc.memset(b, 1, size)  # resident
    pin = libc.malloc(size)  # the heap's top stays in use, so free() alone cannot shrink it
    before = _rss_mb()
    for b in blocks:
        libc.free(b)
    freed = _rss_mb()
    assert heap.release_free_heap() is True
    after = _rss_mb()
    libc.free(pin)
    assert freed - after > 100, (before, freed, after)  # free() kept the pages; the trim returned them


def test_elsewhere_it_does_nothing(monkeypatch):
    monkeypatch.setattr(heap, "_trim", None)
    monkeypatch.setattr(heap.sys, "platform", "darwin")
    assert heap.release_free_heap() is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="resident pages read from /proc")
def test_arrows_pool_hands_back_its_freed_buffers():
    """Arrow's own allocator (mimalloc or jemalloc) keeps freed buffers resident; the call
    hands them back too (1M nodes: the output keys' Arrow transients, ~200 MB)."""
    import gc

    import numpy as np
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    arrays = [pa.array(np.arange(i, i + 20000, dtype=np.int64)).cast(pa.string()) for i in range(0, 300 * 20000, 20000)]
    before = _rss_mb()
    del arrays
    gc.collect()
    freed = _rss_mb()
    heap.release_free_heap()
    after = _rss_mb()
    assert before - after > 40 and freed - after > 40, (before, freed, after)  # ~80 MB kept by the pool until then


def test_a_round_hands_back_its_planners_blocks_before_the_merger_runs(monkeypatch):
    """The planner's freed blocks (1M nodes: ~280 MB) go back before the merger's inputs and
    texts are made: each round trims between its plan and its merger call."""
    import memforest_gpu.engine.compression as round_mod
    import memforest_gpu.engine.memory as memory_mod
    from memforest_gpu import CompressConfig, MergeConfig, compress
    from memforest_gpu.store.synthetic import synthetic_store

    events = []
    real_plan, real_merge = round_mod.plan_round, round_mod.merge_texts
    monkeypatch.setattr(memory_mod, "release_free_heap", lambda *a: events.append("trim"))
    monkeypatch.setattr(round_mod, "plan_round", lambda *a, **k: events.append("plan") or real_plan(*a, **k))
    monkeypatch.setattr(round_mod, "merge_texts", lambda *a, **k: events.append("merge") or real_merge(*a, **k))
    compress(synthetic_store(200, tenants=2, dim=8, seed=1), CompressConfig(merge=MergeConfig(ratio=0.5)))
    merges = [i for i, e in enumerate(events) if e == "merge"]
    assert merges and all(events[i - 1] == "trim" and "plan" in events[:i] for i in merges)


@pytest.mark.skipif(not _glibc(), reason="malloc_trim is glibc's")
def test_a_heap_with_little_free_is_not_scanned(monkeypatch):
    """``min_free``: the C heap is trimmed only when its free blocks reach that many bytes."""
    calls = []
    heap.release_free_heap()  # looked up
    real = heap._trim
    monkeypatch.setattr(heap, "_trim", lambda pad: calls.append(pad) or real(pad))
    free = heap._free_bytes()
    assert 0 <= free < float("inf")
    assert heap.release_free_heap(min_free=int(free) + (1 << 40)) is False and calls == []
    assert heap.release_free_heap(min_free=1) is (free >= 1) and heap.release_free_heap() is True
    assert len(calls) == 1 + (free >= 1)
