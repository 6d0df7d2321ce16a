"""What a review page shows, as plain data (no browser needed to test it).

A page is built from the store before the run (``before``: the texts, dates and metadata of
the memories that went into merges) and the run's merged nodes (:class:`~.groups.Groups`,
from a merge log, a dry run's plan or two store files: :mod:`.groups`).

:func:`review_data` turns them into the page's data: the run summary (from the run's report
when there is one), every tenant's row, histograms over every merged node (exact even when the
list of nodes is sampled), flags, and a bounded sample of merged nodes with their inputs
(:mod:`.sample`). Everything is JSON-ready; :mod:`.page` renders it.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pyarrow.compute as pc

from ..sentences import normalize, split_sentences
from ..store.memory_store import MemoryStore
from .groups import Groups, groups_from_merges, groups_from_plan, groups_from_stores, load_columns
from .limits import Limits
from .sample import describe, pick

__all__ = ["Groups", "Limits", "groups_from_merges", "groups_from_plan", "groups_from_stores", "review_data",
           "load_columns", "dropped_spans", "FLAGS"]

FLAGS = {
    "low_similarity": "low similarity",
    "long_span": "long time span",
    "condensed": "text dropped",
    "mixed_metadata": "mixed metadata",
}
DAY = 86400.0


def dropped_spans(text: str, merged: str | None) -> list[list[int]]:
    """Character ranges ``[start, end)`` of the sentences of ``text`` that the merged text
    does not hold (neither verbatim, after lowercasing and dropping punctuation, nor with
    nine in ten of their words): what a condensed (or rewritten) merge dropped."""
    if not merged:
        return []
    mt = normalize(merged)
    flat, words = " " + " ".join(mt) + " ", set(mt)
    out, pos = [], 0
    for s in split_sentences(text):
        at = text.find(s, pos)
        if at < 0:
            continue
        pos = at + len(s)
        toks = normalize(s)
        if not toks or (" " + " ".join(toks) + " ") in flat:
            continue
        if sum(t in words for t in toks) >= 0.9 * len(toks):
            continue
        out.append([at, at + len(s)])
    return out


def _mixed(metas: list[str]) -> list[str]:
    """The text-valued metadata keys with different values among ``metas`` (JSON objects);
    numeric values (session numbers, counters) do not count."""
    if all(m in ("{}", "", None) for m in metas):
        return []
    seen: dict[str, set] = {}
    for m in metas:
        try:
            d = json.loads(m) if m else {}
        except ValueError:
            continue
        if not isinstance(d, dict):
            continue
        for k, v in d.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                continue
            seen.setdefault(k, set()).add(json.dumps(v, sort_keys=True, default=str))
    return sorted(k for k, vs in seen.items() if len(vs) > 1)


def _hist(values: np.ndarray, edges: np.ndarray) -> dict:
    v = values[np.isfinite(values)]
    counts, _ = np.histogram(v, bins=edges)
    return {"edges": [round(float(e), 6) for e in edges], "counts": counts.tolist(), "n": int(len(v))}


def _tenant_rows(before: MemoryStore, groups: Groups, report: dict | None, after_counts: dict | None,
                 planned: bool) -> list[dict]:
    names = before.tenant_names()
    n_in = dict(zip(names, np.bincount(before.tenant_codes_np, minlength=len(names)).tolist()))
    rows = {}
    rep_rows = (report or {}).get("tenants") or []
    for r in rep_rows:
        t, n = r["tenant"], int(r["nodes_in"])
        if "requested" in r:
            asked = int(r["requested"])
        elif "keep" in r:  # compact: down to what the tenant keeps
            asked = max(0, n - int(r["keep"]))
        else:
            asked = int(r.get("removed", 0))
        rows[t] = {"tenant": t, "nodes_in": n, "nodes_out": int(r.get("nodes_out", n)), "asked": asked,
                   "removed": int(r.get("removed", 0)), "shortfall": int(r.get("shortfall", 0))}
    if not rows:
        asked = (report or {}).get("requested") or {}
        for t in names:
            out = (after_counts or {}).get(t, n_in[t]) if not planned else n_in[t]
            rows[t] = {"tenant": t, "nodes_in": n_in[t], "nodes_out": out, "asked": int(asked.get(t, n_in[t] - out)),
                       "removed": n_in[t] - out, "shortfall": max(0, int(asked.get(t, 0)) - (n_in[t] - out))
                       if not planned else 0}
    for r in rows.values():
        r["asked_share"] = r["asked"] / r["nodes_in"] if r["nodes_in"] else 0.0  # the tenant's rounding
        r["ratio"] = r["removed"] / r["nodes_in"] if r["nodes_in"] else 0.0
        r["merged"] = r["flagged"] = r["shown"] = 0
    for t in groups.tenant:  # a tenant of the merge log the report has no row for
        if t not in rows:
            rows[t] = {"tenant": t, "nodes_in": n_in.get(t, 0), "nodes_out": n_in.get(t, 0), "asked": 0, "removed": 0,
                       "shortfall": 0, "asked_share": 0.0, "ratio": 0.0, "merged": 0, "flagged": 0, "shown": 0}
    return list(rows.values())


@dataclass
class _Flags:
    """Per merged node: its time span (seconds), the flags, the mixed metadata keys, how
    suspect it is (flags, then dissimilar) and the bytes it costs on the page."""

    span: np.ndarray
    low: np.ndarray
    long_: np.ndarray
    mixed: np.ndarray
    mixed_keys: dict[int, list[str]]
    score: np.ndarray
    cost: np.ndarray


def _mixed_nodes(before: MemoryStore, groups: Groups) -> tuple[np.ndarray, dict[int, list[str]]]:
    """Which nodes mix text-valued metadata (:func:`_mixed`), and the keys of each."""
    G = len(groups)
    metas_all = before.metadata.arrow
    mixed = np.zeros(G, dtype=bool)
    mixed_keys: dict[int, list[str]] = {}
    nonempty = np.asarray(pc.not_equal(metas_all, "{}").fill_null(False))
    if nonempty.any() and G:
        hit = np.maximum.reduceat(nonempty[groups.rows].astype(np.int8), groups.start[:-1]) > 0
        for g in np.flatnonzero(hit).tolist():
            rs = groups.rows[groups.start[g]:groups.start[g + 1]]
            keys = _mixed(metas_all.take(rs).to_pylist())
            if keys:
                mixed[g] = True
                mixed_keys[g] = keys
    return mixed, mixed_keys


def _flags(before: MemoryStore, groups: Groups, lim: Limits, ts: np.ndarray) -> _Flags:
    G = len(groups)
    size = groups.size
    if G:
        span = np.maximum.reduceat(ts[groups.rows], groups.start[:-1]) - np.minimum.reduceat(ts[groups.rows],
                                                                                             groups.start[:-1])
    else:
        span = np.zeros(0)
    sim = groups.similarity
    low = np.nan_to_num(sim, nan=np.inf) < lim.low_similarity
    long_ = span > lim.long_span_days * DAY
    mixed, mixed_keys = _mixed_nodes(before, groups)
    score = low.astype(np.float64) + long_ + mixed + np.nan_to_num(1.0 - sim, nan=0.0) / 4  # flags, then dissimilar
    texts = before.texts.arrow
    tlen = np.asarray(pc.binary_length(pc.cast(texts, "large_binary")), dtype=np.int64) if len(before) else \
        np.zeros(0, dtype=np.int64)
    cost = np.add.reduceat(tlen[groups.rows], groups.start[:-1]) if G else np.zeros(0, dtype=np.int64)
    cost = cost + np.array([len(t or "") for t in groups.text], dtype=np.int64) + 160 * size + 200 if G else cost
    return _Flags(span, low, long_, mixed, mixed_keys, score, cost)


def _nodes(before: MemoryStore, groups: Groups, shown: np.ndarray, ts: np.ndarray, f: _Flags) -> tuple[list, int]:
    """The shown nodes with their inputs (and what the merged text dropped of each), and how
    many of them dropped text."""
    texts, ids, metas = before.texts.arrow, before.ids.arrow, before.metadata.arrow
    sim, size = groups.similarity, groups.size
    nodes = []
    condensed_shown = 0
    for g in shown.tolist():
        rs = groups.rows[groups.start[g]:groups.start[g + 1]]
        mtexts = texts.take(rs).to_pylist()
        text = groups.text[g]
        members = []
        any_drop = False
        for r, mt, mid, md in zip(rs.tolist(), mtexts, ids.take(rs).to_pylist(), metas.take(rs).to_pylist()):
            drop = dropped_spans(mt, text)
            any_drop |= bool(drop)
            members.append({"id": mid, "text": mt, "ts": float(ts[r]), "meta": md if md not in ("{}", None) else "",
                            "drop": drop})
        flags = [k for k, on in (("low_similarity", f.low[g]), ("long_span", f.long_[g]), ("condensed", any_drop),
                                 ("mixed_metadata", f.mixed[g])) if on]
        condensed_shown += any_drop
        nodes.append({"tenant": groups.tenant[g], "id": groups.ids[g], "text": text,
                      "sim": None if not math.isfinite(sim[g]) else round(float(sim[g]), 4), "size": int(size[g]),
                      "merges": int(groups.merges[g]), "span": float(f.span[g]), "flags": flags,
                      "mixed": f.mixed_keys.get(g, []), "members": members})
    return nodes, condensed_shown


def _count_tenants(tenant_rows: list[dict], groups: Groups, f: _Flags, nodes: list[dict]) -> None:
    """Each tenant row's merged, flagged and shown nodes."""
    by_t = {r["tenant"]: r for r in tenant_rows}
    flagged = f.low | f.long_ | f.mixed
    for t, fl in zip(groups.tenant, flagged.tolist()):
        by_t[t]["merged"] += 1
        by_t[t]["flagged"] += fl
    for n in nodes:
        by_t[n["tenant"]]["shown"] += 1


def _summary(before: MemoryStore, groups: Groups, command: str, report: dict | None, tenant_rows: list[dict],
             f: _Flags, condensed_shown: int, sizes: dict | None) -> dict:
    rep = report or {}
    sizes = sizes or {}
    nodes_in = int(rep.get("nodes_in", len(before)))
    nodes_out = int(rep.get("nodes_out", sum(r["nodes_out"] for r in tenant_rows)))
    asked = sum(r["asked"] for r in tenant_rows)
    flag = rep.get("ratio_asked")  # the run's --ratio, where the report holds it
    known = int(np.isfinite(groups.similarity).sum())
    return {
        "command": command, "planned": groups.planned, "nodes_in": nodes_in, "nodes_out": nodes_out,
        "removed": nodes_in - nodes_out, "ratio_reached": (nodes_in - nodes_out) / nodes_in if nodes_in else 0.0,
        "asked": asked, "asked_share": asked / nodes_in if nodes_in else 0.0,
        "ratio_asked": float(flag) if isinstance(flag, (int, float)) and not isinstance(flag, bool) else None,
        "shortfall": int(rep.get("shortfall", sum(r["shortfall"] for r in tenant_rows))),
        "tenants": len(tenant_rows), "merged_nodes": len(groups),
        "merges": int(rep.get("merges", int(groups.merges.sum()))),
        "rounds": rep.get("rounds"), "trees": rep.get("trees"), "kept": rep.get("kept"),
        "condensed": rep.get("condensed"), "condensed_tokens": rep.get("condensed_tokens"),
        "fallbacks": rep.get("fallbacks"), "merger": rep.get("merger"), "embedder": rep.get("embedder"),
        "schedule": rep.get("schedule"), "max_node_tokens": rep.get("max_node_tokens"),
        "merger_stats": rep.get("merger_stats"), "seconds": {k: float(v) for k, v in (rep.get("seconds") or {}).items()
                                                            if isinstance(v, (int, float))},
        "flagged": {"low_similarity": int(f.low.sum()) if known or not len(groups) else None,
                    "long_span": int(f.long_.sum()), "mixed_metadata": int(f.mixed.sum()),
                    "condensed_shown": condensed_shown},
        "similarity_from": groups.similarity_from, "similarity_known": known,
        # vector rows and bytes in and out, in the output's encoding (store/size.py); None: unknown
        "size_in": rep.get("size_in") or sizes.get("size_in"), "size_out": rep.get("size_out") or sizes.get("size_out"),
    }


def _plots(groups: Groups, tenant_rows: list[dict], span: np.ndarray) -> dict:
    """The histograms (over every merged node, shown or not) and the top tenants' bars."""
    G, size, sim, planned = len(groups), groups.size, groups.similarity, groups.planned
    finite = sim[np.isfinite(sim)]
    lo = math.floor(min(0.0, float(finite.min())) * 20) / 20 if len(finite) else 0.0
    sim_edges = np.round(np.arange(lo, 1.0 + 1e-9, 0.02), 4)
    span_days = span / DAY
    top = max(1.0, float(span_days.max()) if G else 1.0)
    span_edges = np.unique(np.r_[0.0, np.geomspace(1 / 24, top * 1.0001, 40)]) if top > 1 / 24 else np.array([0, 1.0])
    smax = int(size.max()) if G else 2
    removed_edges = None
    removed = np.array([r["removed"] if not planned else r["asked"] for r in tenant_rows], dtype=np.float64)
    if len(removed):
        hi = max(1, int(removed.max()))
        removed_edges = np.arange(0, hi + 2) - 0.5 if hi <= 60 else np.linspace(0, hi * 1.0001, 41)
    topt = sorted(tenant_rows, key=lambda r: (-(r["asked"] if planned else r["removed"]), r["tenant"]))[:30]
    return {
        "size": {"x": list(range(2, smax + 1)), "y": np.bincount(size, minlength=smax + 1)[2:].tolist()},
        "similarity": _hist(np.minimum(sim, 1.0), sim_edges),
        "span_days": _hist(span_days, span_edges),
        "tenant_removed": _hist(removed, removed_edges) if removed_edges is not None else None,
        "top_tenants": {"tenant": [r["tenant"] for r in topt], "asked": [r["asked"] for r in topt],
                        "removed": [r["removed"] for r in topt], "nodes_in": [r["nodes_in"] for r in topt]},
    }


def review_data(before: MemoryStore, groups: Groups, *, command: str, report: dict | None = None,
                after_counts: dict | None = None, limits: Limits | None = None, paths: dict | None = None,
                notes: list[str] | None = None, sizes: dict | None = None) -> dict:
    """The page's data. ``before``: the store the run read (texts, dates and metadata of the
    merged nodes' inputs); ``report``: the run's report as a dict (``CompressReport.to_dict()``
    and what ``--report`` adds; ``None``: the summary comes from the stores, with
    ``after_counts``: nodes per tenant afterwards); ``command``: the command line's name for
    the run; ``paths``: the files, shown as they are; ``notes``: lines said under the summary;
    ``sizes``: ``{"size_in", "size_out"}`` (``StoreSize.to_dict()``, one encoding) where the
    report has none."""
    lim = limits or Limits()
    ts = before.timestamps.cpu().numpy()
    f = _flags(before, groups, lim, ts)
    tenant_rows = _tenant_rows(before, groups, report, after_counts, groups.planned)
    tsize = {r["tenant"]: r["nodes_in"] for r in tenant_rows}
    flagged = f.low | f.long_ | f.mixed
    shown = pick(groups.tenant, f.score, flagged, tsize, lim, f.cost)
    nodes, condensed_shown = _nodes(before, groups, shown, ts, f)
    _count_tenants(tenant_rows, groups, f, nodes)
    summary = _summary(before, groups, command, report, tenant_rows, f, condensed_shown, sizes)
    plots = _plots(groups, tenant_rows, f.span)
    sample = describe(groups.tenant, shown, flagged, tsize, lim, groups.planned)
    cols = ["tenant", "nodes_in", "nodes_out", "asked", "asked_share", "removed", "ratio", "shortfall", "merged",
            "flagged", "shown"]
    tenants = {c: [round(r[c], 4) if isinstance(r[c], float) else r[c] for r in tenant_rows] for c in cols}
    return {"version": 1, "summary": summary, "tenants": tenants, "plots": plots, "nodes": nodes, "sample": sample,
            "flags": FLAGS, "thresholds": {"low_similarity": lim.low_similarity, "long_span_days": lim.long_span_days},
            "paths": paths or {}, "notes": notes or []}
