"""Row blocks for bounding a temporary without changing a result."""
from __future__ import annotations

__all__ = ["row_blocks"]


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
