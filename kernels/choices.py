"""The kernels' option values that a config checks before any kernel is loaded (no torch here):
:data:`SEEDINGS`, the k-means seedings of :mod:`.lloyd`."""
from __future__ import annotations

__all__ = ["SEEDINGS"]

#: ``"batched"``: D^2 sampling in growing batches; ``"k-means||"``: oversampling rounds, then the seeds
#: drawn from the candidates; ``"k-means++"``: one centre per step (:mod:`.seeding`)
SEEDINGS = ("batched", "k-means||", "k-means++")
