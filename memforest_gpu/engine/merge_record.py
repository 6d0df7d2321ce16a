"""One record per merge: the run's log, the journal's replay key and the dry run share it."""
from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["MergeRecord"]


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
