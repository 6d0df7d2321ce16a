"""The drift bound of one-vector stores: a pair whose merged vector would leave an input behind
goes last.

A store searched by one vector per memory (``MergeConfig.keys = 0``: a Mem0 collection, a
pgvector table) finds a merged node only through the embedding of its merged text. When a short
memory merges into a long one, that embedding is mostly the long one's, and a question about the
short one no longer finds the node (docs/long-memories.md, "One vector per memory").

The planner estimates the merged vector as the token-weighted mean of the two inputs' vectors (a
mean-pooling embedder's vector of a concatenation is close to it), ``m = t_a v_a + t_b v_b``, so
with ``c = cos(v_a, v_b)``:

    cos(m, v_a) = (t_a + t_b c) / |m|,   cos(m, v_b) = (t_b + t_a c) / |m|,
    |m| = sqrt(t_a^2 + t_b^2 + 2 t_a t_b c)

(equal weights without token counts). A pair whose smaller of the two is below
``TreeConfig.drift_min_cos`` is **refused**: its edge weight loses :data:`REFUSED` (more than any
edge weight can differ), so it is merged only when a tree has no other pair left for its quota and
the asked ratio is still reached. Equal lengths pass at ``c >= 2 bound^2 - 1``; a short memory next
to a much longer one needs ``c`` close to the bound itself. ``None`` (the default): no bound.

The same way, ``TreeConfig.length_last`` (tokens) sends last the pairs whose estimated merged length
(:func:`~.edges.merged_length`) passes it: a node does not grow past what a context budget can
show while any other pair is left, and the ratio is still reached (unlike the ``strict`` cap policy,
which takes such pairs out of the tree).
"""
from __future__ import annotations

import torch

__all__ = ["REFUSED", "merged_cosines", "drift_refused", "sent_last"]

REFUSED = 4.0  # weights (cosine, time bonus, size term) span less than this


def merged_cosines(cos: torch.Tensor, tok_a: torch.Tensor | None, tok_b: torch.Tensor | None):
    """(cos(m, v_a), cos(m, v_b)) of the estimated merged vector (module doc).

    Shape: cos (...), tok_a / tok_b broadcastable to it (or None: equal weights) -> two (...)
    """
    if tok_a is None or tok_b is None:
        ta = tb = torch.ones_like(cos)
    else:
        ta, tb = tok_a.to(cos.dtype).clamp(min=1), tok_b.to(cos.dtype).clamp(min=1)
    norm = torch.sqrt((ta * ta + tb * tb + 2 * ta * tb * cos).clamp(min=1e-12))
    return (ta + tb * cos) / norm, (tb + ta * cos) / norm


def drift_refused(wt: torch.Tensor, cos: torch.Tensor, tok_a, tok_b, bound: float, kind: str = "max") -> torch.Tensor:
    """``wt`` with the pairs over the drift bound sent last (lowered by :data:`REFUSED`; raised
    for the minimum spanning tree ablation). Shape: wt, cos (...) -> (...)"""
    ca, cb = merged_cosines(cos, tok_a, tok_b)
    over = torch.minimum(ca, cb) < bound
    return wt + REFUSED * over.to(wt.dtype) if kind == "min" else wt - REFUSED * over.to(wt.dtype)


def sent_last(wt: torch.Tensor, cos: torch.Tensor, tok_a, tok_b, est, tree) -> torch.Tensor:
    """``wt`` with the pairs over ``tree.drift_min_cos`` or ``tree.length_last`` sent last (each
    bound when set; ``est`` the estimated merged lengths, needed by the length bound).
    Shape: wt, cos, est (...) -> (...)"""
    if tree.drift_min_cos is not None:
        wt = drift_refused(wt, cos, tok_a, tok_b, tree.drift_min_cos, tree.kind)
    if tree.length_last is not None and est is not None:
        over = (est > tree.length_last).to(wt.dtype)
        wt = wt + REFUSED * over if tree.kind == "min" else wt - REFUSED * over
    return wt
