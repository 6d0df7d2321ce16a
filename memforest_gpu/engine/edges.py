"""The weight of a spanning-tree edge: one elementwise function for every pair the planner scores.

``w = cos`` (docs/method.md section 2), or with the optional terms of
:class:`~memforest_gpu.config.SpanningConfig`:
``(1 - time_weight) * cos + time_weight * [gap <= time_window] * g(cos)`` (gap: positions
between the two nodes' spans; ``g`` by ``time_rule``: :func:`time_weighted`), minus
``size_weight * est / size_unit`` (est: the merged node's estimated length,
:func:`merged_length`); a pair whose merge would pass the planner's cap is no edge (-inf).
The same function scores the padded (B, m, m) matrices of the dense graph and the (E,) edges
of the knn graph, so the two agree bit for bit wherever they score the same pair.

Read top to bottom: the ends of an edge (:class:`Ends`), the weight (:func:`edge_weight`),
the merged length and the time term; then the bounds that send a pair last (the drift bound
of one-vector stores and the length bound, :func:`sent_last`).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..config import SpanningConfig

__all__ = ["Ends", "ends_of", "edge_weight", "time_weighted", "DATE_TAG_TOKENS", "DAY_SECONDS", "utc_day",
           "merged_length", "REFUSED", "merged_cosines", "drift_refused", "sent_last"]


class Ends(NamedTuple):
    """Per-slot attributes an edge weight reads, for one end of a set of edges: ``lo`` / ``hi``
    first and last position of the slot's originals (int64), ``tok`` token count (int64 or
    None), ``day`` UTC day of its timestamp (float64 or None). Any broadcastable shapes."""

    lo: torch.Tensor
    hi: torch.Tensor
    tok: torch.Tensor | None
    day: torch.Tensor | None

    def map(self, fn) -> Ends:
        """``fn`` applied to every attribute that is present."""
        return Ends(*(None if x is None else fn(x) for x in self))

    def at(self, index) -> Ends:
        """The same attributes indexed by ``index`` (any indexing expression)."""
        return self.map(lambda x: x[index])

    def in_rows(self, idx: torch.Tensor) -> Ends:
        """Attributes of slots ``idx`` of each row. Shape: fields (B, m), idx (B, ...) -> (B,
        ...)"""
        B = idx.shape[0]
        flat = idx.reshape(B, -1).clamp(min=0)
        return self.map(lambda x: x.gather(1, flat).view(idx.shape))

    @staticmethod
    def cat(parts: list[Ends]) -> Ends:
        """The attributes of ``parts`` concatenated along their first dimension."""
        return Ends(*(None if x[0] is None else torch.cat(x) for x in zip(*parts)))


def ends_of(lo: torch.Tensor, hi: torch.Tensor, tok: torch.Tensor | None, ts: torch.Tensor) -> Ends:
    """:class:`Ends` of slots from their spans, token counts and timestamps (float64 epoch
    seconds)."""
    return Ends(lo, hi, tok, utc_day(ts) if tok is not None else None)


def edge_weight(cos: torch.Tensor, a: Ends, b: Ends, spanning: SpanningConfig, cap: int | None = None):
    """The weight the spanning tree is built on, and the estimated merged length (or None).
    ``spanning`` is the spanning stage's config (:class:`~memforest_gpu.config.SpanningConfig`).

    ``spanning.kind == "min"`` adds the size term instead (an ablation: the minimum spanning
    tree), with +inf for a pair over the cap; ``"random"`` callers pass random weights as
    ``cos`` (no time or size term, the cap still applies).

    Shape: cos (...), a and b broadcastable to it -> weight (...) in cos's dtype, est (...)
           int64 or None
    """
    kind = spanning.kind
    wt = cos
    tw = spanning.time_weight
    if tw > 0 and kind != "random":  # local time on the edges: neighbouring spans of positions get the bonus
        gap = torch.maximum(a.lo, b.lo) - torch.minimum(a.hi, b.hi)
        wt = time_weighted(cos, gap, spanning)
    est = None
    sized = spanning.size_weight > 0 and kind != "random"
    if a.tok is not None and (sized or cap is not None or spanning.length_last is not None):
        est = merged_length(a.tok, b.tok, a.day, b.day)
    if sized and est is not None:  # the merged node's estimated length, in units of size_unit tokens
        pen = spanning.size_weight * est.to(cos.dtype) / float(spanning.size_unit)
        wt = wt + pen if kind == "min" else wt - pen
    if kind != "random":  # pairs sent last (engine/edges.py): drifting from an input, or too long for the context
        wt = sent_last(wt, cos, a.tok, b.tok, est, spanning)
    if cap is not None and est is not None:
        # a pair whose merge would pass the cap is no edge: the tree spans the pairs that fit,
        # so a full node drops out of its tree instead of blocking it (docs/method.md: "the next best edge")
        wt = wt.masked_fill(est > cap, float("inf") if kind == "min" else float("-inf"))
    return wt, est


# The merged-length estimate: an upper bound on a merge's tokens before it is made.
#
# A merge holds both texts, plus date tags when its inputs fall on different UTC days. The
# planner uses the estimate for the node-token cap and the size term on tree edges; the
# merging baselines use the same rule for their cap.
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


# The local-time term of a tree edge: one elementwise function of (cosine, gap, config).
#
# ``w = (1 - time_weight) * cos + time_weight * [gap <= time_window] * g(cos)``, ``gap`` the
# positions between the two nodes' spans (1 for neighbouring memories), by ``time_rule``:
#
# - ``"flat"``: ``g = 1``, a 0/1 bonus for neighbours whatever they say (with ``time_weight``
#   0.5 a neighbour pair of cosine 0 outweighs any other pair of cosine below 1, so on a store
#   whose topics are interleaved in time most merges join unrelated memories);
# - ``"scaled"``: ``g = max(cos, 0)``, the bonus scaled by the cosine: a neighbour pair weighs
#   ``cos``, any other pair ``(1 - time_weight) * cos``. Time multiplies meaning instead of
#   replacing it: an unrelated neighbour (cosine ~0) gets no bonus;
# - ``"gated"`` (the default): ``g = [cos >= time_min_cos]``, the full bonus only for
#   neighbours that are related (``time_min_cos`` 0.3: in all-MiniLM-L6-v2 space 90% of
#   LoCoMo's neighbouring turns and 76% of its neighbouring facts pass, a random pair of a
#   conversation half the time), so a conversation keeps its question-and-answer pairs while
#   unrelated neighbours merge by meaning only. Chosen over ``"scaled"`` on the LoCoMo dev
#   file (docs/presets.md).
#
# Every rule leaves a non-neighbour pair at ``(1 - time_weight) * cos`` and never gives a pair
# more than the flat rule does, so a nearest-neighbour search on ``(1 - time_weight) * cos`` plus
# the time neighbours still finds every pair the weight can rank first. ``time_weight`` 0 is
# the paper (cosine only) under every rule.
def time_weighted(cos: torch.Tensor, gap: torch.Tensor, spanning: SpanningConfig) -> torch.Tensor:
    """Edge weights with the local-time term of ``spanning`` (the comment above); ``cos``
    itself when ``spanning.time_weight`` is 0.

    Shape: cos (...) float, gap (...) integer positions, broadcastable -> (...) in cos's dtype

    >>> time_weighted(torch.tensor([0.0, 0.6]), torch.tensor([1, 1]),
    ...     SpanningConfig(time_weight=0.5, time_rule="scaled"))
    tensor([0.0000, 0.6000])
    """
    tw = spanning.time_weight
    if tw == 0:
        return cos
    near = gap <= spanning.time_window
    if spanning.time_rule == "scaled":
        bonus = near.to(cos.dtype) * cos.clamp(min=0)
    elif spanning.time_rule == "gated":
        bonus = (near & (cos >= spanning.time_min_cos)).to(cos.dtype)
    else:  # "flat"
        bonus = near.to(cos.dtype)
    return (1 - tw) * cos + tw * bonus


# ------------------------------------------------------------------------------
# The drift bound of one-vector stores: a pair whose merged vector would leave an input behind
# goes last.
#
# A store searched by one vector per memory (``MergeConfig.keys = 0``: a Mem0 collection, a
# pgvector table) finds a merged node only through the embedding of its merged text. When a short
# memory merges into a long one, that embedding is mostly the long one's, and a question about the
# short one no longer finds the node (docs/long-memories.md, "One vector per memory").
#
# The planner estimates the merged vector as the token-weighted mean of the two inputs' vectors (a
# mean-pooling embedder's vector of a concatenation is close to it), ``m = t_a v_a + t_b v_b``, so
# with ``c = cos(v_a, v_b)``:
#
#     cos(m, v_a) = (t_a + t_b c) / |m|,   cos(m, v_b) = (t_b + t_a c) / |m|,
#     |m| = sqrt(t_a^2 + t_b^2 + 2 t_a t_b c)
#
# (equal weights without token counts). A pair whose smaller of the two is below
# ``SpanningConfig.drift_min_cos`` is **refused**: its edge weight loses :data:`REFUSED` (more than any
# edge weight can differ), so it is merged only when a tree has no other pair left for its quota and
# the asked ratio is still reached. Equal lengths pass at ``c >= 2 bound^2 - 1``; a short memory next
# to a much longer one needs ``c`` close to the bound itself. ``None`` (the default): no bound.
#
# The same way, ``SpanningConfig.length_last`` (tokens) sends last the pairs whose estimated merged length
# (:func:`~.edges.merged_length`) passes it: a node does not grow past what a context budget can
# show while any other pair is left, and the ratio is still reached (unlike the ``strict`` cap policy,
# which takes such pairs out of the tree).
# ------------------------------------------------------------------------------

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


def sent_last(wt: torch.Tensor, cos: torch.Tensor, tok_a, tok_b, est, spanning) -> torch.Tensor:
    """``wt`` with the pairs over ``spanning.drift_min_cos`` or ``spanning.length_last`` sent
    last (each bound when set; ``est`` the estimated merged lengths, needed by the length bound).
    Shape: wt, cos, est (...) -> (...)"""
    if spanning.drift_min_cos is not None:
        wt = drift_refused(wt, cos, tok_a, tok_b, spanning.drift_min_cos, spanning.kind)
    if spanning.length_last is not None and est is not None:
        over = (est > spanning.length_last).to(wt.dtype)
        wt = wt + REFUSED * over if spanning.kind == "min" else wt - REFUSED * over
    return wt
