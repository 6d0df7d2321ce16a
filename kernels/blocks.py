"""Row blocks for bounding a temporary without changing a result, and how big a block of
streaming work should be on a device."""
from __future__ import annotations

import os

import torch

__all__ = ["row_blocks", "stream_rows", "problem_blocks", "gather_bytes", "for_device"]

#: bytes of one block of streaming work (convert, scatter, gather) on the CPU: it stays in the
#: cache between the steps of the block, and the allocator reuses it instead of mapping fresh
#: pages (a CPU pass over a 200 MB temporary costs several times the same pass over 2 MB tiles)
CPU_BLOCK_BYTES = 2 << 20
#: on a GPU a block only bounds memory: bigger blocks mean fewer kernel launches
GPU_BLOCK_BYTES = 256 << 20


def stream_rows(device: torch.device | str, row_bytes: int, *, at_least: int = 1) -> int:
    """Rows per block for streaming work of ``row_bytes`` bytes a row on ``device``: a
    cache-sized block on the CPU, a large one on a GPU. Results never depend on it."""
    limit = GPU_BLOCK_BYTES if torch.device(device).type == "cuda" else CPU_BLOCK_BYTES
    return max(at_least, limit // max(1, int(row_bytes)))


def for_device(table: dict, device: torch.device | str):
    """A per-device bound (``{"cpu": ..., "cuda": ...}``): ``table``'s value for ``device``'s
    type, its ``"cuda"`` value on any other accelerator."""
    kind = torch.device(device).type
    return table[kind] if kind in table else table["cuda"]


def row_blocks(n: int, step: int) -> list[slice]:
    """Slices covering ``0..n`` in blocks of ``step`` rows, the last one never a lone row (it
    joins the block before it) unless ``n`` is 1.

    A per-row sum over D gives the same bits whether it runs over all rows at once or a
    block at a time, except when a block has one output only: then the CPU reduction may
    split D across threads (from 32,768 elements on) and sum in another order. Blocks of
    ``T >= 2`` problems never have one output; these blocks keep ``T = 1`` callers exact too.
    """
    step = max(2, int(step))
    starts = list(range(0, n, step))
    if len(starts) > 1 and n - starts[-1] == 1:
        starts.pop()
    return [slice(a, b) for a, b in zip(starts, starts[1:] + [n])]


#: the share of the machine's memory (host RAM, or the GPU's) one gathered block of problems may take
GATHER_SHARE = 1 / 32
#: and at most this many bytes on the CPU (k-means is bound by the products there, not by the block;
#: a block of 256 MiB and k-means's copy of its active problems rose the 1M partition 0.9 GB over its read)
CPU_GATHER_CAP = 64 << 20


def gather_bytes(device: torch.device | str, memory_budget: int | None = None) -> int:
    """Bytes one gathered block of padded problems (a bucket's (T, n, D) vectors) may take on
    ``device``: a share (:data:`GATHER_SHARE`) of ``memory_budget`` when one is given, else of the
    device's memory (on the CPU at most :data:`CPU_GATHER_CAP`). Results never depend on it."""
    if memory_budget is not None:
        return max(1, int(memory_budget * GATHER_SHARE))
    dev = torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.get_device_properties(dev).total_memory * GATHER_SHARE)
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        ram = 8 << 30
    return min(CPU_GATHER_CAP, int(ram * GATHER_SHARE))


def problem_blocks(count: int, problem_bytes: int, limit: int) -> list[slice]:
    """Slices of ``count`` padded problems of ``problem_bytes`` bytes each, as many in a block as
    fit in ``limit`` bytes (at least one). A problem's result never depends on its batch-mates,
    so running a bucket a block at a time gives its results while bounding the gathered copy."""
    step = max(1, int(limit) // max(1, int(problem_bytes)))
    return [slice(a, min(count, a + step)) for a in range(0, count, step)]
