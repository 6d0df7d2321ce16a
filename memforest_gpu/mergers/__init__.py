"""Mergers: turn two memories into one text. See :mod:`.base` for the protocol."""
from .base import MemoryItem, MergePair, Merger
from .extractive import ExtractiveMerger

__all__ = ["MemoryItem", "MergePair", "Merger", "ExtractiveMerger", "get_merger", "MERGERS"]

MERGERS = ("extractive",)


def get_merger(name: str = "extractive", **options) -> Merger:
    """Build a merger by name; unknown names list the valid ones."""
    if name == "extractive":
        return ExtractiveMerger(**options)
    raise ValueError(f"merger must be one of {list(MERGERS)}, got {name!r}")
