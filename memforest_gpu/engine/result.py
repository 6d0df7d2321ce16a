"""What a run returns: the report, the compressed store with every merge, and a dry run's
first-round pairs."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..mergers.base import MergePair
from ..report import CompressReport
from ..store.memory_store import MemoryStore
from .merge_record import MergeRecord

__all__ = ["CompressReport", "CompressResult", "DryRunResult"]


@dataclass
class CompressResult:
    store: MemoryStore
    report: CompressReport
    merges: list[MergeRecord]  # every merge, in order


@dataclass
class DryRunResult:
    """A dry run: the first round's merges (``into=None``) and the merger inputs they would
    make (``pairs``, aligned with ``merges``); ``requested``: the removals each tenant is
    asked for (the whole run's, not only the first round's)."""

    merges: list[MergeRecord]
    pairs: list[MergePair]
    report: CompressReport
    requested: dict = field(default_factory=dict)
