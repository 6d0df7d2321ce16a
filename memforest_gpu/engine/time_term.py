"""The local-time term of a tree edge: one elementwise function of (cosine, gap, config).

``w = (1 - time_weight) * cos + time_weight * [gap <= time_window] * g(cos)``, ``gap`` the
positions between the two nodes' spans (1 for neighbouring memories), by ``time_rule``:

- ``"flat"``: ``g = 1``, a 0/1 bonus for neighbours whatever they say (with ``time_weight``
  0.5 a neighbour pair of cosine 0 outweighs any other pair of cosine below 1, so on a store
  whose topics are interleaved in time most merges join unrelated memories);
- ``"scaled"``: ``g = max(cos, 0)``, the bonus scaled by the cosine: a neighbour pair weighs
  ``cos``, any other pair ``(1 - time_weight) * cos``. Time multiplies meaning instead of
  replacing it: an unrelated neighbour (cosine ~0) gets no bonus;
- ``"gated"`` (the default): ``g = [cos >= time_min_cos]``, the full bonus only for
  neighbours that are related (``time_min_cos`` 0.3: in all-MiniLM-L6-v2 space 90% of
  LoCoMo's neighbouring turns and 76% of its neighbouring facts pass, a random pair of a
  conversation half the time), so a conversation keeps its question-and-answer pairs while
  unrelated neighbours merge by meaning only. Chosen over ``"scaled"`` on the LoCoMo dev
  file (docs/presets.md).

Every rule leaves a non-neighbour pair at ``(1 - time_weight) * cos`` and never gives a pair
more than the flat rule does, so a nearest-neighbour search on ``(1 - time_weight) * cos`` plus
the time neighbours still finds every pair the weight can rank first. ``time_weight`` 0 is
the paper (cosine only) under every rule.
"""
from __future__ import annotations

import torch

from ..config import TreeConfig

__all__ = ["time_weighted"]


def time_weighted(cos: torch.Tensor, gap: torch.Tensor, tree: TreeConfig) -> torch.Tensor:
    """Edge weights with the local-time term of ``tree`` (module doc); ``cos`` itself when
    ``tree.time_weight`` is 0.

    Shape: cos (...) float, gap (...) integer positions, broadcastable -> (...) in cos's dtype

    >>> time_weighted(torch.tensor([0.0, 0.6]), torch.tensor([1, 1]),
    ...     TreeConfig(time_weight=0.5, time_rule="scaled"))
    tensor([0.0000, 0.6000])
    """
    tw = tree.time_weight
    if tw == 0:
        return cos
    near = gap <= tree.time_window
    if tree.time_rule == "scaled":
        bonus = near.to(cos.dtype) * cos.clamp(min=0)
    elif tree.time_rule == "gated":
        bonus = (near & (cos >= tree.time_min_cos)).to(cos.dtype)
    else:  # "flat"
        bonus = near.to(cos.dtype)
    return (1 - tw) * cos + tw * bonus
