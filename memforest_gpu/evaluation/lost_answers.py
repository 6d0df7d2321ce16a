"""Where the lost answers of a compressed store go, by cause (issue 38, docs/long-memories.md).

A question **lost** its answer when its AnsR@B on the compressed store is below that on the
uncompressed store (both ``@B`` contexts from :func:`~.context_fill.contexts`). Its **lost tokens**
are the answer tokens the uncompressed context showed and the compressed one does not. The
cause, first that applies:

1. ``no_evidence``: the question has no evidence node (it cannot be traced);
2. ``condensed``: a lost token is in the original text of an evidence memory but no longer in the
   text of the merged node that holds it (the merge dropped it: the ``condense`` cap policy cutting
   a merge to the embedder's window, or a duplicate removed);
3. ``crowded``: no node holding an evidence memory is in the context, but one ranks within as many
   nodes as the uncompressed context showed (it was found as well as the original was; longer
   nodes ranked above it spent the budget) -- needs the ranked lists;
4. ``not_found``: no node holding an evidence memory is in the context (the merged node ranks
   below what the budget reaches);
5. ``too_long``: a node holding an evidence memory is in the context but was cut before every
   evidence memory's text starts (a long merged node spent the budget before the part that matched);
6. ``other``: the evidence was shown; the lost tokens came from other memories of the uncompressed
   context that the compressed one crowded out.

``crowded`` and ``too_long`` together are the merged nodes too long for the context budget.

For a knowledge-update question (``updates[question id]`` gives ``old``, ``new`` and the new
fact's id, :mod:`.long_shapes`) the same causes read: ``condensed`` = the new value lost in the
merge, ``too_long`` = the new value buried under the old (cut after it), ``not_found`` = the node
with the new value not found. Apart from losses, :func:`update_reading` counts contexts that show
the old value without the new (``stale``) and those showing both with the old first (``old_first``).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .metrics import tokens

__all__ = ["CAUSES", "shown_tokens", "classify", "lost_table", "update_reading"]

CAUSES = ("condensed", "crowded", "not_found", "too_long", "other", "no_evidence")


def shown_tokens(ctx) -> set[str]:
    """Tokens of a context (the parts shown)."""
    out: set[str] = set()
    for _, v, cut in ctx:
        out |= v.tok if cut is None else set(tokens(v.rendered[:cut]))
    return out


def classify(base_ctxs, comp_ctxs, store, answers: Sequence[frozenset], evidence: Sequence[frozenset],
             original_text: dict[str, str], ranked: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(cause per question, AnsR@B lost per question): cause "" where nothing was lost;
    ``ranked`` (Q, C) the compressed store's ranked nodes (without it, no ``crowded``).
    Shape: -> (Q,) object, (Q,) float64 (base minus compressed AnsR@B, 0 where not lost)"""
    holder = {s: j for j, src in enumerate(store.sources) for s in src}
    Q = len(answers)
    cause = np.full(Q, "", dtype=object)
    lost = np.zeros(Q)
    for q in range(Q):
        ans = answers[q]
        if not ans:
            continue
        t0, t1 = shown_tokens(base_ctxs[q]), shown_tokens(comp_ctxs[q])
        a0, a1 = len(ans & t0) / len(ans), len(ans & t1) / len(ans)
        if a1 >= a0:
            continue
        lost[q] = a0 - a1
        gone = (ans & t0) - t1
        ev = evidence[q]
        if not ev:
            cause[q] = "no_evidence"
            continue
        nodes = {holder[s] for s in ev if s in holder}
        ev_tok = set().union(*(tokens(original_text.get(s, "")) for s in ev))
        kept_tok = set().union(*(tokens(store.texts[j]) for j in nodes)) if nodes else set()
        if any(t in ev_tok and t not in kept_tok for t in gone):
            cause[q] = "condensed"
            continue
        parts = [(v, cut) for j, v, cut in comp_ctxs[q] if j in nodes]
        if not parts:
            row = [] if ranked is None else [int(x) for x in ranked[q][:len(base_ctxs[q])]]
            cause[q] = "crowded" if nodes.intersection(row) else "not_found"
        elif not any(p < (len(v.rendered) if cut is None else cut) for v, cut in parts
                     for s, p in v.starts.items() if s in ev):
            cause[q] = "too_long"
        else:
            cause[q] = "other"
    return cause, lost


def lost_table(cause: np.ndarray, lost: np.ndarray, base_ansr: np.ndarray, mask: np.ndarray | None = None) -> dict:
    """Per cause: lost answers (questions) and points (AnsR@B lost as points of the uncompressed
    mean over the questions of ``mask``)."""
    m = np.ones(len(cause), bool) if mask is None else mask
    ok = m & ~np.isnan(base_ansr)
    denom = float(np.nanmean(base_ansr[ok])) * ok.sum()
    out = {c: {"answers": int(((cause == c) & ok).sum()),
               "points": float(100 * lost[(cause == c) & ok].sum() / denom) if denom else 0.0} for c in CAUSES}
    out["all"] = {"answers": int(((cause != "") & ok).sum()), "points": float(100 * lost[ok].sum() / denom)}
    return out


def update_reading(ctxs, updates: dict, question_ids: Sequence[str]) -> dict:
    """Knowledge-update contexts: how many show the new value, the old without the new (stale),
    both with the old first (old_first). Positions are those of the first token of each value."""
    res = {"questions": 0, "new_shown": 0, "stale": 0, "old_first": 0}
    for q, qid in enumerate(question_ids):
        u = updates.get(qid)
        if u is None:
            continue
        res["questions"] += 1
        text = " ".join(v.rendered if cut is None else v.rendered[:cut] for _, v, cut in ctxs[q]).lower()
        where = {}
        for k in ("old", "new"):
            toks = tokens(u[k])
            pos = [i for i, t in enumerate(tokens(text)) if t == toks[0]]
            where[k] = pos[0] if pos and set(toks) <= set(tokens(text)) else None
        if where["new"] is not None:
            res["new_shown"] += 1
            if where["old"] is not None and where["old"] < where["new"]:
                res["old_first"] += 1
        elif where["old"] is not None:
            res["stale"] += 1
    return res
