"""What a review page shows, as plain data (no browser needed to test it).

A page is built from the store before the run (``before``: the texts, dates and metadata of
the memories that went into merges) and the run's merged nodes, found in one of three ways:

- :func:`groups_from_merges`: a run's merge log (``a + b -> into``, in order); each final
  node's inputs are the leaves of its merge tree, its similarity the lowest of its merges';
- :func:`groups_from_plan`: a dry run's first round (``into=None``): one planned pair each;
- :func:`groups_from_stores`: an input and an output store file (``memforest review``): an
  output node stands for the input nodes that hold its ``sources``; its similarity is the
  weakest link between their vectors (the smallest edge of their maximum spanning tree; for
  two inputs, their cosine, as in the merge log).

:func:`review_data` turns them into the page's data: the run summary (from the run's report
when there is one), every tenant's row, histograms over every merged node (exact even when the
list of nodes is sampled), flags, and a bounded sample of merged nodes with their inputs
(:class:`Limits`). Everything is JSON-ready; :mod:`.page` renders it.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

import numpy as np
import torch

from ..mergers.extractive import normalize, split_sentences
from ..store.memory_store import MemoryStore

__all__ = ["Groups", "Limits", "groups_from_merges", "groups_from_plan", "groups_from_stores", "review_data",
           "load_columns", "dropped_spans", "FLAGS"]

FLAGS = {
    "low_similarity": "low similarity",
    "long_span": "long time span",
    "condensed": "text dropped",
    "mixed_metadata": "mixed metadata",
}
DAY = 86400.0


@dataclass
class Limits:
    """How much of a big run a page holds. Every tenant gets a summary row; merged nodes are
    shown for the ``full_tenants`` largest tenants in full (at most ``full_limit`` each), then
    at most ``per_tenant`` per other tenant (flagged and least similar first, tenants with the
    most suspect merge first) while ``max_nodes`` nodes and ``max_text_bytes`` bytes of text
    last. ``low_similarity`` and ``long_span_days`` are the flags' thresholds."""

    max_nodes: int = 10_000
    max_text_bytes: int = 8_000_000
    per_tenant: int = 3
    full_tenants: int = 5
    full_limit: int = 1_000
    low_similarity: float = 0.3
    long_span_days: float = 30.0

    def __post_init__(self):
        for k in ("max_nodes", "max_text_bytes", "per_tenant", "full_tenants", "full_limit"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{k} must be an integer >= 0, got {v!r}")
        if not -1.0 <= self.low_similarity <= 1.0:
            raise ValueError(f"low_similarity must be in [-1, 1], got {self.low_similarity!r}")
        if not (self.long_span_days >= 0 and math.isfinite(self.long_span_days)):
            raise ValueError(f"long_span_days must be >= 0, got {self.long_span_days!r}")


@dataclass
class Groups:
    """The merged (or planned) nodes of a run, columnar: ``rows[start[g]:start[g+1]]`` are
    the ``before`` rows of node ``g`` (oldest first); ``text`` is ``None`` for a planned pair."""

    tenant: list[str]
    ids: list[str | None]
    text: list[str | None]
    start: np.ndarray  # (G + 1,) int64
    rows: np.ndarray  # (sum of sizes,) int64
    similarity: np.ndarray  # (G,) float64, nan: unknown
    merges: np.ndarray  # (G,) int64, merges that made the node
    similarity_from: str  # how similarity was found (said on the page)
    planned: bool = False

    def __len__(self) -> int:
        return len(self.tenant)

    @property
    def size(self) -> np.ndarray:
        return np.diff(self.start)


def load_columns(path: str, *, format: str | None = None, vectors: bool = False) -> MemoryStore:
    """A store file's columns without embedding anything: the file's vectors when
    ``vectors`` and it has them, else a 1-dimensional placeholder per node (never used)."""
    from ..store import jsonl, parquet
    from ..store.io import detect_format
    fmt = detect_format(path, format)
    cols, name = parquet.read_parquet_columns(path) if fmt == "parquet" else jsonl.read_jsonl_columns(path)
    emb = cols["embedding"] if vectors else None
    n = len(cols["id"])
    try:
        return MemoryStore.from_columns(ids=cols["id"], texts=cols["text"], timestamps=cols["timestamp"],
                                        embeddings=emb if emb is not None else torch.ones(n, 1),
                                        tenants=cols["tenant"], sources=cols["sources"], metadata=cols["metadata"],
                                        embedder=name if emb is not None else None)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e


def _rows_of(store: MemoryStore, ids: list[str]) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc
    idx = pc.index_in(pa.array(ids, type=pa.large_string()), value_set=store.ids.arrow)
    if idx.null_count:
        missing = [i for i, v in zip(ids, idx.is_null().to_pylist()) if v][:3]
        raise ValueError(f"the merge log names nodes the store before the run does not hold: {missing}")
    return idx.to_numpy(zero_copy_only=False).astype(np.int64)


def _csr(members: list[list[int]], ts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    sizes = np.fromiter((len(m) for m in members), dtype=np.int64, count=len(members))
    start = np.zeros(len(members) + 1, dtype=np.int64)
    np.cumsum(sizes, out=start[1:])
    rows = np.fromiter((r for m in members for r in m), dtype=np.int64, count=int(start[-1]))
    # oldest first inside each node (stable: ties keep the store's order)
    g = np.repeat(np.arange(len(members)), sizes)
    order = np.lexsort((rows, ts[rows], g))
    return start, rows[order]


def groups_from_merges(before: MemoryStore, merges) -> Groups:
    """The final nodes of a merge log over ``before``'s ids."""
    leaves: dict[str, list[str]] = {}
    low: dict[str, float] = {}
    count: dict[str, int] = {}
    info: dict[str, tuple[str, str | None]] = {}
    for m in merges:
        la, lb = leaves.pop(m.a, None), leaves.pop(m.b, None)
        leaves[m.into] = (la if la is not None else [m.a]) + (lb if lb is not None else [m.b])
        low[m.into] = min(m.similarity, low.pop(m.a, math.inf), low.pop(m.b, math.inf))
        count[m.into] = 1 + count.pop(m.a, 0) + count.pop(m.b, 0)
        info.pop(m.a, None), info.pop(m.b, None)
        info[m.into] = (m.tenant, m.text)
    roots = list(leaves)
    flat = [i for r in roots for i in leaves[r]]
    pos = _rows_of(before, flat) if flat else np.zeros(0, dtype=np.int64)
    members, k = [], 0
    for r in roots:
        n = len(leaves[r])
        members.append(pos[k:k + n].tolist())
        k += n
    ts = before.timestamps.cpu().numpy()
    start, rows = _csr(members, ts)
    return Groups([info[r][0] for r in roots], roots, [info[r][1] for r in roots], start, rows,
                  np.array([low[r] for r in roots], dtype=np.float64),
                  np.array([count[r] for r in roots], dtype=np.int64),
                  "the lowest cosine of the merges that made the node (the run's merge log)")


def groups_from_plan(before: MemoryStore, merges) -> Groups:
    """A dry run's planned pairs (first round)."""
    merges = list(merges)
    flat = [i for m in merges for i in (m.a, m.b)]
    pos = _rows_of(before, flat) if flat else np.zeros(0, dtype=np.int64)
    ts = before.timestamps.cpu().numpy()
    start, rows = _csr([pos[2 * j:2 * j + 2].tolist() for j in range(len(merges))], ts)
    return Groups([m.tenant for m in merges], [None] * len(merges), [None] * len(merges), start, rows,
                  np.array([m.similarity for m in merges], dtype=np.float64), np.ones(len(merges), dtype=np.int64),
                  "the cosine of the two memories (the plan)", planned=True)


def groups_from_stores(before: MemoryStore, after: MemoryStore) -> Groups:
    """The nodes of ``after`` that stand for two or more nodes of ``before`` (by ``sources``)."""
    b_src = before.sources.arrow
    b_len = np.diff(b_src.offsets.to_numpy()).astype(np.int64)
    b_row = np.repeat(np.arange(len(before), dtype=np.int64), b_len)
    orig = {s: r for s, r in zip(b_src.values.to_pylist(), b_row.tolist())}
    a_src = after.sources.arrow
    a_off = a_src.offsets.to_numpy()
    a_vals = a_src.values.to_pylist()
    ids, texts, tenants = after.ids, after.texts, after.tenants
    members, out_ids, out_text, out_ten = [], [], [], []
    multi = np.flatnonzero(np.diff(a_off) > 1)
    for j in multi.tolist():
        rs = sorted({orig[s] for s in a_vals[a_off[j]:a_off[j + 1]] if s in orig})
        if len(rs) < 2:
            continue
        members.append(rs)
        out_ids.append(ids[j])
        out_text.append(texts[j])
        out_ten.append(tenants[j])
    ts = before.timestamps.cpu().numpy()
    start, rows = _csr(members, ts)
    has_vectors = before.embeddings.shape[1] > 1
    sim = _weakest_links(before.embeddings, start, rows) if has_vectors else np.full(len(members), np.nan)
    how = ("the weakest link between the input nodes' vectors (the smallest edge of their maximum spanning tree; "
           "for two nodes, their cosine)" if has_vectors else "unknown (the input store holds no vectors)")
    return Groups(out_ten, out_ids, out_text, start, rows, sim, np.diff(start) - 1, how)


def _weakest_links(vectors: torch.Tensor, start: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Per node: the smallest edge of the maximum spanning tree of its inputs' cosines
    (Prim's algorithm, batched over the nodes of one size)."""
    size = np.diff(start)
    out = np.full(len(size), np.nan)
    for k in np.unique(size).tolist():
        gs = np.flatnonzero(size == k)
        for lo in range(0, len(gs), 4096):
            g = gs[lo:lo + 4096]
            idx = rows[start[g][:, None] + np.arange(k)[None, :]]
            v = vectors[torch.as_tensor(idx)].float()
            v = torch.nn.functional.normalize(v, dim=-1)
            sim = v @ v.transpose(1, 2)  # (B, k, k)
            inside = torch.zeros(len(g), k, dtype=torch.bool)
            inside[:, 0] = True
            best = sim[:, 0, :].clone()
            low = torch.full((len(g),), math.inf)
            for _ in range(k - 1):
                cand = best.masked_fill(inside, -math.inf)
                val, j = cand.max(dim=1)
                low = torch.minimum(low, val)
                inside[torch.arange(len(g)), j] = True
                best = torch.maximum(best, sim[torch.arange(len(g)), j, :])
            out[g] = low.double().numpy()
    return out


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
        r["ratio_asked"] = r["asked"] / r["nodes_in"] if r["nodes_in"] else 0.0
        r["ratio"] = r["removed"] / r["nodes_in"] if r["nodes_in"] else 0.0
        r["merged"] = r["flagged"] = r["shown"] = 0
    for t in groups.tenant:  # a tenant of the merge log the report has no row for
        if t not in rows:
            rows[t] = {"tenant": t, "nodes_in": n_in.get(t, 0), "nodes_out": n_in.get(t, 0), "asked": 0, "removed": 0,
                       "shortfall": 0, "ratio_asked": 0.0, "ratio": 0.0, "merged": 0, "flagged": 0, "shown": 0}
    return list(rows.values())


def _pick(groups: Groups, score: np.ndarray, tenant_size: dict, lim: Limits, cost: np.ndarray) -> np.ndarray:
    """The nodes shown, in the order of :class:`Limits`."""
    G = len(groups)
    if G == 0:
        return np.zeros(0, dtype=np.int64)
    names, code = np.unique(np.array(groups.tenant, dtype=object), return_inverse=True)
    order = np.lexsort((np.arange(G), -score, code))  # per tenant: most suspect first
    first = np.r_[0, np.flatnonzero(np.diff(code[order])) + 1]
    rank = np.empty(G, dtype=np.int64)
    rank[order] = np.arange(G) - np.repeat(first, np.diff(np.r_[first, G]))
    big = sorted(range(len(names)), key=lambda j: (-tenant_size.get(names[j], 0), names[j]))[:lim.full_tenants]
    full = np.zeros(len(names), dtype=bool)
    full[big] = True
    best = np.full(len(names), -np.inf)
    np.maximum.at(best, code, score)
    in_full = full[code] & (rank < lim.full_limit)
    rest = ~full[code] & (rank < lim.per_tenant)
    # full tenants first (largest first), then rank by rank over the other tenants, the most suspect tenants first
    size_rank = np.zeros(len(names), dtype=np.int64)
    size_rank[big] = np.arange(len(big))
    a = np.flatnonzero(in_full)
    a = a[np.lexsort((rank[a], size_rank[code[a]]))]
    b = np.flatnonzero(rest)
    b = b[np.lexsort((code[b], -best[code[b]], -score[b], rank[b]))]
    cand = np.concatenate([a, b])[:lim.max_nodes]
    within = np.cumsum(cost[cand]) <= lim.max_text_bytes
    return cand[within]


def review_data(before: MemoryStore, groups: Groups, *, command: str, report: dict | None = None,
                after_counts: dict | None = None, limits: Limits | None = None, paths: dict | None = None,
                notes: list[str] | None = None) -> dict:
    """The page's data. ``before``: the store the run read (texts, dates and metadata of the
    merged nodes' inputs); ``report``: the run's report as a dict (``CompressReport.to_dict()``
    and what ``--report`` adds; ``None``: the summary comes from the stores, with
    ``after_counts``: nodes per tenant afterwards); ``command``: the command line's name for
    the run; ``paths``: the files, shown as they are; ``notes``: lines said under the summary."""
    lim = limits or Limits()
    planned = groups.planned
    ts = before.timestamps.cpu().numpy()
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
    metas_all = before.metadata.arrow
    mixed = np.zeros(G, dtype=bool)
    mixed_keys: dict[int, list[str]] = {}
    import pyarrow.compute as pc
    nonempty = np.asarray(pc.not_equal(metas_all, "{}").fill_null(False))
    if nonempty.any() and G:
        hit = np.maximum.reduceat(nonempty[groups.rows].astype(np.int8), groups.start[:-1]) > 0
        for g in np.flatnonzero(hit).tolist():
            rs = groups.rows[groups.start[g]:groups.start[g + 1]]
            keys = _mixed(metas_all.take(rs).to_pylist())
            if keys:
                mixed[g] = True
                mixed_keys[g] = keys
    score = low.astype(np.float64) + long_ + mixed + np.nan_to_num(1.0 - sim, nan=0.0) / 4  # flags, then dissimilar
    texts = before.texts.arrow
    tlen = np.asarray(pc.binary_length(pc.cast(texts, "large_binary")), dtype=np.int64) if len(before) else \
        np.zeros(0, dtype=np.int64)
    cost = np.add.reduceat(tlen[groups.rows], groups.start[:-1]) if G else np.zeros(0, dtype=np.int64)
    cost = cost + np.array([len(t or "") for t in groups.text], dtype=np.int64) + 160 * size + 200 if G else cost
    tenant_rows = _tenant_rows(before, groups, report, after_counts, planned)
    tsize = {r["tenant"]: r["nodes_in"] for r in tenant_rows}
    shown = _pick(groups, score, tsize, lim, cost)

    ids = before.ids.arrow
    metas = before.metadata.arrow
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
        flags = [f for f, on in (("low_similarity", low[g]), ("long_span", long_[g]), ("condensed", any_drop),
                                 ("mixed_metadata", mixed[g])) if on]
        condensed_shown += any_drop
        nodes.append({"tenant": groups.tenant[g], "id": groups.ids[g], "text": text,
                      "sim": None if not math.isfinite(sim[g]) else round(float(sim[g]), 4), "size": int(size[g]),
                      "merges": int(groups.merges[g]), "span": float(span[g]), "flags": flags,
                      "mixed": mixed_keys.get(g, []), "members": members})
    by_t = {r["tenant"]: r for r in tenant_rows}
    flagged = low | long_ | mixed
    for t, f in zip(groups.tenant, flagged.tolist()):
        by_t[t]["merged"] += 1
        by_t[t]["flagged"] += f
    for n in nodes:
        by_t[n["tenant"]]["shown"] += 1

    rep = report or {}
    nodes_in = int(rep.get("nodes_in", len(before)))
    nodes_out = int(rep.get("nodes_out", sum(r["nodes_out"] for r in tenant_rows)))
    asked = sum(r["asked"] for r in tenant_rows)
    summary = {
        "command": command, "planned": planned, "nodes_in": nodes_in, "nodes_out": nodes_out,
        "removed": nodes_in - nodes_out, "ratio_reached": (nodes_in - nodes_out) / nodes_in if nodes_in else 0.0,
        "asked": asked, "ratio_asked": asked / nodes_in if nodes_in else 0.0,
        "shortfall": int(rep.get("shortfall", sum(r["shortfall"] for r in tenant_rows))),
        "tenants": len(tenant_rows), "merged_nodes": G, "merges": int(rep.get("merges", int(groups.merges.sum()))),
        "rounds": rep.get("rounds"), "trees": rep.get("trees"), "kept": rep.get("kept"),
        "condensed": rep.get("condensed"), "condensed_tokens": rep.get("condensed_tokens"),
        "fallbacks": rep.get("fallbacks"), "merger": rep.get("merger"), "embedder": rep.get("embedder"),
        "schedule": rep.get("schedule"), "max_node_tokens": rep.get("max_node_tokens"),
        "merger_stats": rep.get("merger_stats"), "seconds": {k: float(v) for k, v in (rep.get("seconds") or {}).items()
                                                            if isinstance(v, (int, float))},
        "flagged": {"low_similarity": int(low.sum()), "long_span": int(long_.sum()),
                    "mixed_metadata": int(mixed.sum()), "condensed_shown": condensed_shown},
        "similarity_from": groups.similarity_from,
    }
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
    plots = {
        "size": {"x": list(range(2, smax + 1)), "y": np.bincount(size, minlength=smax + 1)[2:].tolist()},
        "similarity": _hist(np.minimum(sim, 1.0), sim_edges),
        "span_days": _hist(span_days, span_edges),
        "tenant_removed": _hist(removed, removed_edges) if removed_edges is not None else None,
        "top_tenants": {"tenant": [r["tenant"] for r in topt], "asked": [r["asked"] for r in topt],
                        "removed": [r["removed"] for r in topt], "nodes_in": [r["nodes_in"] for r in topt]},
    }
    n_full = min(lim.full_tenants, len({*groups.tenant}))
    sample = {
        "shown": len(nodes), "of": G, "limits": asdict(lim),
        "rule": (f"the {n_full} largest tenants with merges in full (up to {lim.full_limit} merged nodes each), then "
                 f"up to {lim.per_tenant} merged nodes of every other tenant, flagged and least similar first, "
                 f"within {lim.max_nodes} nodes and {lim.max_text_bytes / 1e6:g} MB of text in all")
        if len(nodes) < G else "every merged node" if not planned else "every planned pair",
    }
    cols = ["tenant", "nodes_in", "nodes_out", "asked", "ratio_asked", "removed", "ratio", "shortfall", "merged",
            "flagged", "shown"]
    tenants = {c: [round(r[c], 4) if isinstance(r[c], float) else r[c] for r in tenant_rows] for c in cols}
    return {"version": 1, "summary": summary, "tenants": tenants, "plots": plots, "nodes": nodes, "sample": sample,
            "flags": FLAGS, "thresholds": {"low_similarity": lim.low_similarity, "long_span_days": lim.long_span_days},
            "paths": paths or {}, "notes": notes or []}
