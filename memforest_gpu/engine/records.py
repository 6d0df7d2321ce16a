"""One record per merge: the run's log, the journal's replay key and the dry run share it."""
from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["MergeRecord"]


@dataclass(frozen=True)
class MergeRecord:
    """``a`` (older) and ``b`` (newer) merged into ``into`` in round ``round`` of tenant
    ``tenant``; ``similarity`` is the cosine of the two inputs. A dry run's records
    (:func:`memforest_gpu.engine.dry_run`) have ``into=None`` and ``text=None``."""

    round: int
    tenant: str
    a: str
    b: str
    similarity: float
    into: str | None = None
    text: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)
