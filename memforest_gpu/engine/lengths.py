"""The merged-length estimate: an upper bound on a merge's tokens before it is made.

A merge holds both texts, plus date tags when its inputs fall on different UTC days. The
planner uses the estimate for the node-token cap and the size term on tree edges; the
merging baselines use the same rule for their cap.
"""
from __future__ import annotations

import torch

__all__ = ["DATE_TAG_TOKENS", "DAY_SECONDS", "utc_day", "merged_length"]

DATE_TAG_TOKENS = 12  # upper bound on the word pieces the date tags of one merge add
DAY_SECONDS = 86400.0


def utc_day(ts: torch.Tensor) -> torch.Tensor:
    """The UTC day of epoch seconds (float64), as a float. Shape: any -> same"""
    return torch.floor(ts / DAY_SECONDS)


def merged_length(tok_a: torch.Tensor, tok_b: torch.Tensor, day_a: torch.Tensor, day_b: torch.Tensor) -> torch.Tensor:
    """Estimated tokens of merging a with b: ``tok_a + tok_b``, plus :data:`DATE_TAG_TOKENS` when
    their days (:func:`utc_day`) differ. Broadcasts, e.g. ``tok[:, :, None]`` with ``tok[:,
    None, :]``
    for every pair of a tree.

    Shape: tok_a, day_a and tok_b, day_b broadcastable -> int64 of the broadcast shape
    """
    return tok_a + tok_b + DATE_TAG_TOKENS * (day_a != day_b).long()
