"""The ranks of a run: who this process is (:func:`world_of`) and steps that fail on every rank
or on none (:func:`all_ranks`).

A step that can fail on one rank alone (its own merger's server, its own journal, rank 0's
write) must not leave the other ranks waiting in a collective that never completes: after
such a step every rank says whether it failed, and if any did, every rank raises (the rank
that failed its own error, the others :class:`RankFailedError` naming it).
"""
from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import TypeVar

import torch.distributed as dist

from ..runs.errors import FailedElsewhere

__all__ = ["world_of", "all_ranks", "any_rank", "RankFailedError"]

T = TypeVar("T")


def world_of(group=None) -> tuple[int, int]:
    """This process's rank and the number of ranks (``(0, 1)`` without a process group)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    return 0, 1


class RankFailedError(FailedElsewhere):
    """Another rank's step failed (``rank``; ``error``: its exception, or a ``RuntimeError``
    with its message when the exception cannot travel), so this rank stopped too."""

    def __init__(self, rank: int, error: Exception):
        self.rank = rank
        super().__init__(f"rank {rank}", error)

    def __reduce__(self):
        return type(self), (self.rank, self.error)


def _portable(e: Exception) -> Exception:
    """``e`` if it survives pickling (to travel to the other ranks), else its message."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001 - any error of an exception's own pickling
        return RuntimeError(str(e))


def any_rank(flag: object, group=None) -> list[object]:
    """Every rank's ``flag`` (a small picklable value), on every rank."""
    _, n = world_of(group)
    if n == 1:
        return [flag]
    out: list[object] = [None] * n
    dist.all_gather_object(out, flag, group=group)
    return out


def all_ranks(step: Callable[[], T], group=None) -> T:
    """``step()`` on this rank, then every rank learns whether it failed anywhere: this rank's
    own error is raised as is, another rank's as :class:`RankFailedError`. Ctrl-C (not an
    ``Exception``) is not caught: the launcher stops every rank."""
    err: Exception | None = None
    out = None
    try:
        out = step()
    except Exception as e:  # noqa: BLE001 - told to every rank, then raised again below
        err = e
    failed = any_rank(None if err is None else _portable(err), group)
    if err is not None:
        raise err
    for r, other in enumerate(failed):
        if other is not None:
            raise RankFailedError(r, other)
    return out
