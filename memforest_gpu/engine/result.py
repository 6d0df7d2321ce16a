"""What a run returns: the report, the compressed store with every merge, and a dry run's
first-round pairs."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..mergers.base import MergePair
from ..store.memory_store import MemoryStore
from .merge_record import MergeRecord

__all__ = ["CompressReport", "CompressResult", "DryRunResult"]


@dataclass
class CompressReport:
    """What a compression did. ``tenants`` has one dict per tenant."""

    tenants: list[dict]
    nodes_in: int
    nodes_out: int
    trees: int
    rounds: int
    merges: int
    schedule: str
    merger: str
    embedder: str
    max_node_tokens: int | None
    seconds: dict = field(default_factory=dict)
    fallbacks: int = 0
    moved_by_reassignment: int = 0
    kmeans_iterations: dict = field(default_factory=dict)
    condensed: int = 0  # merges cut to the node cap (cap_policy "condense")
    condensed_tokens: int = 0  # tokens those merges dropped, in all
    kept: int = 0  # nodes the keep rule (MergeConfig.keep_pattern) held out of merging

    @property
    def ratio_reached(self) -> float:
        return 1.0 - self.nodes_out / self.nodes_in if self.nodes_in else 0.0

    @property
    def shortfall(self) -> int:
        return sum(t["shortfall"] for t in self.tenants)

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["ratio_reached"] = self.ratio_reached
        d["shortfall"] = self.shortfall
        return d


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
