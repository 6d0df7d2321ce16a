"""Which merged nodes a review page lists when a run has more than it can hold
(:func:`pick`, within the page's :class:`~.limits.Limits`), and what the page says of the choice
(:func:`describe`).
Every tenant keeps its summary row and the plots count every merged node either way."""
from __future__ import annotations

from dataclasses import asdict

import numpy as np

from .limits import Limits

__all__ = ["pick", "describe"]


def _full(names: np.ndarray, tenant_size: dict, lim: Limits) -> list[int]:
    """The largest tenants (of ``names``, the tenants with merges), listed in full."""
    return sorted(range(len(names)), key=lambda j: (-tenant_size.get(names[j], 0), names[j]))[:lim.full_tenants]


def pick(tenant: list[str], score: np.ndarray, flagged: np.ndarray, tenant_size: dict, lim: Limits,
         cost: np.ndarray) -> np.ndarray:
    """The nodes listed (indexes into the run's merged nodes), in the order of :class:`Limits`.

    Shapes: ``tenant`` (G,) names, ``score`` (G,) how suspect (higher: more), ``flagged`` (G,)
    bool, ``cost`` (G,) bytes each takes on the page; ``tenant_size``: nodes in per tenant."""
    G = len(tenant)
    if G == 0:
        return np.zeros(0, dtype=np.int64)
    names, code = np.unique(np.array(tenant, dtype=object), return_inverse=True)
    order = np.lexsort((np.arange(G), -score, code))  # per tenant: most suspect first
    first = np.r_[0, np.flatnonzero(np.diff(code[order])) + 1]
    rank = np.empty(G, dtype=np.int64)
    rank[order] = np.arange(G) - np.repeat(first, np.diff(np.r_[first, G]))
    big = _full(names, tenant_size, lim)
    full = np.zeros(len(names), dtype=bool)
    full[big] = True
    best = np.full(len(names), -np.inf)
    np.maximum.at(best, code, score)
    f = np.flatnonzero(flagged)
    f = f[np.lexsort((f, -score[f]))][:lim.max_flagged]
    # full tenants (largest first), then rank by rank over the other tenants, the most suspect tenants first
    size_rank = np.zeros(len(names), dtype=np.int64)
    size_rank[big] = np.arange(len(big))
    a = np.flatnonzero(full[code] & (rank < lim.full_limit))
    a = a[np.lexsort((rank[a], size_rank[code[a]]))]
    b = np.flatnonzero(~full[code] & (rank < lim.per_tenant))
    b = b[np.lexsort((code[b], -best[code[b]], -score[b], rank[b]))]
    cand = np.concatenate([f, a, b])
    _, at = np.unique(cand, return_index=True)  # a flagged node once, where it comes first
    cand = cand[np.sort(at)][:lim.max_nodes]
    within = np.cumsum(cost[cand]) <= lim.max_text_bytes
    return cand[within]


def describe(tenant: list[str], shown: np.ndarray, flagged: np.ndarray, tenant_size: dict, lim: Limits,
             planned: bool) -> dict:
    """What the page says of its list: how many are listed, of the flagged ones too, how many
    tenants have some listed, and the rule that chose them, in words."""
    G = len(tenant)
    what = "planned pairs" if planned else "merged nodes"
    out = {"shown": len(shown), "of": G, "limits": asdict(lim),
           "flagged": {"listed": int(flagged[shown].sum()) if G else 0, "of": int(flagged.sum())}}
    names, code = np.unique(np.array(tenant, dtype=object), return_inverse=True) if G else (np.array([]), None)
    per = np.bincount(code[shown], minlength=len(names)) if G else np.zeros(0, dtype=np.int64)
    out["tenants"] = {"with_merges": len(names), "listed": int((per > 0).sum())}
    if len(shown) == G:
        out["rule"] = f"every {what[:-1]}"
        return out
    big = _full(names, tenant_size, lim)
    rest = np.ones(len(names), dtype=bool)
    rest[big] = False
    n_rest, listed_rest = int(rest.sum()), int((per[rest] > 0).sum())
    most = int(per[rest].max()) if n_rest else 0
    fl = out["flagged"]
    out["rule"] = (
        f"every flagged {what[:-1]} first, most suspect first, up to {lim.max_flagged:,}; then the {len(big)} largest "
        f"tenants with merges, up to {lim.full_limit:,} each; then, pass by pass, one more of every other tenant, up "
        f"to {lim.per_tenant} each, least similar first; while {lim.max_nodes:,} {what} and "
        f"{lim.max_text_bytes / 1e6:g} MB of text last. Here {fl['listed']:,} of the {fl['of']:,} flagged {what} are "
        f"listed, and {listed_rest:,} of the {n_rest:,} other tenants with merges have some listed (at most {most} "
        f"each), {n_rest - listed_rest:,} none")
    return out
