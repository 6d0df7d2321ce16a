"""The merger protocol: a batch of pairs in, one merged text per pair out.

The engine sends every pair of a merge round (all trees, all tenants) in one call, so
an LLM merger can batch them however it likes. A merger never decides what to merge,
and never sees embeddings; it only writes text.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ..store.column_checks import DEFAULT_TENANT

__all__ = ["MemoryItem", "MergePair", "Merger", "unwrap"]


@dataclass(frozen=True)
class MemoryItem:
    """One side of a merge: a memory's id, text and timestamp (epoch seconds, UTC)."""

    id: str
    text: str
    timestamp: float


@dataclass(frozen=True)
class MergePair:
    """Two memories of one tenant to merge. ``older`` has the earlier timestamp
    (ties: the one that came first in the store) and goes first in the merged text."""

    older: MemoryItem
    newer: MemoryItem
    tenant: str = DEFAULT_TENANT


@runtime_checkable
class Merger(Protocol):
    """``merge(pairs) -> texts``: ``len(texts) == len(pairs)``, each a non-empty string.

    A merger that wraps another without writing text itself (it records, replays or counts
    the other's texts, as the run journal does) also has ``unwrap() -> the merger it wraps``;
    :func:`unwrap` follows it to the merger whose texts these are."""

    name: str

    def merge(self, pairs: Sequence[MergePair]) -> list[str]:  # pragma: no cover - protocol
        ...


def unwrap(merger):
    """The merger that writes ``merger``'s texts: ``merger`` itself, or, past every wrapper
    (an object with ``unwrap()``, see :class:`Merger`), the merger it wraps."""
    while callable(getattr(merger, "unwrap", None)):
        merger = merger.unwrap()
    return merger
