"""What a run returns: the report, the compressed store with every merge, and a dry run's
first-round pairs."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from ..mergers.base import MergePair
from ..report import CompressReport
from ..store.memory_store import MemoryStore

__all__ = ["CompressReport", "CompressResult", "DryRunResult", "MergeRecord"]


@dataclass
class CompressResult:
    store: MemoryStore
    report: CompressReport
    merges: Sequence[MergeRecord]  # every merge, in order (a run's: a MergeLog, engine/merge_log.py)


@dataclass
class DryRunResult:
    """A dry run: the first round's merges (``into=None``) and the merger inputs they would
    make (``pairs``, aligned with ``merges``); ``requested``: the removals each tenant is
    asked for (the whole run's, not only the first round's)."""

    merges: list[MergeRecord]
    pairs: list[MergePair]
    report: CompressReport
    requested: dict = field(default_factory=dict)


# One record per merge: the run's log, the journal's replay key and the dry run share it.
@dataclass(frozen=True, slots=True)
class MergeRecord:
    """``a`` (older) and ``b`` (newer) merged into ``into`` in round ``round`` of tenant
    ``tenant``; ``similarity`` is the cosine of the two inputs. A dry run's records
    (:func:`memforest_gpu.engine.dry_run`) have ``into=None`` and ``text=None``. Slotted: a
    run keeps one per merge (88 bytes each instead of about 350 with an instance dict)."""

    round: int
    tenant: str
    a: str
    b: str
    similarity: float
    into: str | None = None
    text: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)
