"""How much of a big run a review page holds (:class:`Limits`); the ``review`` command's flags
take their defaults from it, so it imports nothing heavy."""
from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Limits"]


@dataclass
class Limits:
    """How much of a big run a page holds. The merged nodes listed are, in this order, while
    ``max_nodes`` nodes and ``max_text_bytes`` bytes of text last: every flagged node (low
    similarity, long time span, mixed metadata), most suspect first, up to ``max_flagged``; the
    ``full_tenants`` largest tenants' nodes (at most ``full_limit`` each); then, pass by pass,
    one more node of every other tenant (its most suspect first, the tenants with the most
    suspect merge first), up to ``per_tenant`` each. ``low_similarity`` and ``long_span_days``
    are the flags' thresholds."""

    max_nodes: int = 10_000
    max_text_bytes: int = 8_000_000
    max_flagged: int = 5_000
    per_tenant: int = 3
    full_tenants: int = 5
    full_limit: int = 1_000
    low_similarity: float = 0.3
    long_span_days: float = 30.0

    def __post_init__(self):
        for k in ("max_nodes", "max_text_bytes", "max_flagged", "per_tenant", "full_tenants", "full_limit"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{k} must be an integer >= 0, got {v!r}")
        if not -1.0 <= self.low_similarity <= 1.0:
            raise ValueError(f"low_similarity must be in [-1, 1], got {self.low_similarity!r}")
        if not (self.long_span_days >= 0 and math.isfinite(self.long_span_days)):
            raise ValueError(f"long_span_days must be >= 0, got {self.long_span_days!r}")
