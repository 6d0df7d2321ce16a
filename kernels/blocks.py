"""Row blocks for bounding a temporary without changing a result, and how big a block of
streaming work should be on a device."""
from __future__ import annotations

import torch

__all__ = ["row_blocks", "stream_rows"]

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
