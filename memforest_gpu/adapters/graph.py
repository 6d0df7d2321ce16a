"""Graph memories (M3-Agent style): text memory nodes linked by weighted edges to entity
nodes (faces, voices, ...). Only the text nodes are compressed; on every merge the merged
node inherits the union of both nodes' edges, weights summed, so no entity loses a link.

File format: one record per node or edge, the same fields in JSONL (one object per line)
and Parquet (one row each; ``metadata`` is a JSON string there)::

    {"kind": "node", "id": "m17", "type": "episodic", "text": "<face_3> picks up a cup.",
     "timestamp": 12, "embedding": [...], "tenant": "video-1", "metadata": {...}}
    {"kind": "node", "id": "face_3", "type": "face", "metadata": {...}}     # an entity node
    {"kind": "edge", "source": "m17", "target": "face_3", "weight": 0.8}

- A node with ``text`` is a text node (compressible); any other node is an entity node
  and is written back unchanged. ``timestamp`` is the clip id (an integer) or epoch
  seconds; ``tenant`` (default ``"default"``) is the graph's scope, e.g. one video.
- Text nodes of different ``type`` (episodic, semantic, ...) or tenant never merge.
- Text nodes need embeddings, all or none (none: embedded on load with ``embedder``).
- Edges are kept as written (source, target): folding maps merged endpoints to the
  merged node and sums the weights of edges that become the same (source, target).
  An edge between two nodes merged into one becomes internal and is dropped (counted).
- A merged node's metadata gets ``merged_from`` (original ids, as ``sources``) and
  ``clip_ids``: every clip id (timestamp) of the originals inside, sorted.
- Text nodes that encode identity are never merged: by default those matching
  :data:`GRAPH_KEEP_PATTERN` (M3-Agent's ``Equivalence:`` lines; ``MergeConfig.keep_pattern``
  names another rule). With ``MergeConfig.merge_within="timestamp"`` text nodes merge only
  within one clip (what an M3-Agent pickle always uses, see :mod:`.m3agent`).
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..config import CompressConfig
from ..engine import CompressReport, compress
from ..engine.partition import group_codes, kept_mask
from ..store.atomic import atomic_open
from ..store.io import detect_format
from ..store.jsonl import iter_jsonl_objects
from ..store.memory_store import MemoryStore
from ..timer import StageTimer
from .streammeco import prune_report, streammeco_keep

__all__ = ["MemoryGraph", "GraphCompressResult", "read_graph", "write_graph", "compress_graph", "graph_config",
           "fold_edges", "GRAPH_KEEP_PATTERN", "GRAPH_METHODS"]

#: ``compress_graph(method=...)``: MemForest (merging), or the StreamMeCo baseline (pruning,
#: :mod:`.streammeco`)
GRAPH_METHODS = ("memforest", "streammeco")

#: The graph default for ``MergeConfig.keep_pattern``: M3-Agent's identity lines
#: ("Equivalence: <face_0>, <voice_1>."), which M3-Agent finds by
#: ``contents[0].lower().startswith("equivalence")`` and turns into characters.
GRAPH_KEEP_PATTERN = r"(?i)^equivalence"

_SEP = "\x1f"  # joins tenant and node type into the engine's tenant key
_FIELDS = {"node": ("kind", "id", "type", "text", "timestamp", "embedding", "tenant", "sources", "metadata"),
           "edge": ("kind", "source", "target", "weight")}


@dataclass(eq=False)
class MemoryGraph:
    """Text nodes as a store (``types`` (N,) node type of each), entity nodes verbatim,
    and edges as three parallel columns ``source`` (E,), ``target`` (E,), ``weight`` (E,)."""

    texts: MemoryStore | None
    types: list[str]
    entities: list[dict]
    source: list[str]
    target: list[str]
    weight: np.ndarray  # (E,) float64

    def node_ids(self) -> set[str]:
        return set(self.texts.ids if self.texts is not None else []) | {e["id"] for e in self.entities}


@dataclass
class GraphCompressResult:
    graph: MemoryGraph
    report: CompressReport
    merges: list[dict]  # the engine's merge log: a, b -> into, in order
    internal_edges: int = 0  # edges between two nodes that were merged into one (dropped)
    info: dict = field(default_factory=dict)


def fold_edges(source: list[str], target: list[str], weight: np.ndarray, merges: list):
    """Replay a merge log (``a, b -> into`` in order) over an edge list: endpoints follow
    their node into the merged node, edges that become the same (source, target) are
    summed (in edge order), edges inside one merged node are dropped.

    Shape: (E,), (E,), (E,) -> (E',), (E',), (E',) float64, n_internal
    """
    rep: dict[str, str] = {}
    for m in merges:
        rep[m.a] = m.into
        rep[m.b] = m.into

    def find(x: str) -> str:
        path = []
        while x in rep:
            path.append(x)
            x = rep[x]
        for p in path:  # path compression
            rep[p] = x
        return x

    out: dict[tuple[str, str], float] = {}
    internal = 0
    for s, t, w in zip(source, target, np.asarray(weight, dtype=np.float64).tolist()):
        s2, t2 = find(s), find(t)
        if s2 == t2 and s != t:
            internal += 1
            continue
        out[(s2, t2)] = out.get((s2, t2), 0.0) + w
    keys = list(out)
    return [k[0] for k in keys], [k[1] for k in keys], np.array([out[k] for k in keys], dtype=np.float64), internal


def graph_config(config: CompressConfig | None) -> CompressConfig:
    """``config`` (default: the method's) with the graph default for the keep rule: text nodes that
    match :data:`GRAPH_KEEP_PATTERN` (M3-Agent's identity lines) never merge, unless
    ``config.merge.keep_pattern`` names another rule."""
    cfg = config or CompressConfig()
    if cfg.merge.keep_pattern is not None:
        return cfg
    return dataclasses.replace(cfg, merge=dataclasses.replace(cfg.merge, keep_pattern=GRAPH_KEEP_PATTERN))


def compress_graph(graph: MemoryGraph, config: CompressConfig | None = None, *, merger=None, embedder=None,
                   device=None, progress: bool = False, method: str = "memforest") -> GraphCompressResult:
    """Compress the text nodes of ``graph`` with MemForest (per tenant and node type) and
    fold the edges through the merge log. Entity nodes are unchanged. Text nodes that match
    the keep rule (:func:`graph_config`) are never merged. ``method="streammeco"``: prune them
    with the StreamMeCo baseline instead (:func:`_streammeco`)."""
    if graph.texts is None:
        raise ValueError("graph must have at least one text node to compress, got 0")
    if method not in GRAPH_METHODS:
        raise ValueError(f"method must be one of {list(GRAPH_METHODS)}, got {method!r}")
    if method == "streammeco":
        return _streammeco(graph, graph_config(config))
    st = graph.texts
    keyed = MemoryStore(st.ids, st.texts, st.embeddings, st.timestamps,
                        [f"{t}{_SEP}{ty}" for t, ty in zip(st.tenants, graph.types)],
                        st.sources, st.metadata, st.embedder, keys=st.keys)
    res = compress(keyed, graph_config(config), merger=merger, embedder=embedder, device=device, progress=progress)
    res.report.tenants = [dataclasses.replace(row, tenant=row.tenant.replace(_SEP, "/"))  # "video-1/episodic"
                          for row in res.report.tenants]
    res.merges = [dataclasses.replace(m, tenant=m.tenant.replace(_SEP, "/")) for m in res.merges]
    out = res.store
    # clip ids of every input node, then of every merged node, by replaying the log
    clips: dict[str, list] = {}
    meta_by_id = dict(zip(st.ids, st.metadata))
    for i, ts in zip(st.ids, st.timestamps.cpu().tolist()):
        clips[i] = list(meta_by_id[i].get("clip_ids") or [_number(ts)])
    for m in res.merges:
        clips[m.into] = sorted(set(clips[m.a]) | set(clips[m.b]))
    tenants, types, metas = [], [], []
    for node_id, key, meta, src in zip(out.ids, out.tenants, out.metadata, out.sources):
        t, ty = key.split(_SEP, 1)
        tenants.append(t)
        types.append(ty)
        if node_id not in meta_by_id:  # a merged node
            meta = {**meta, "merged_from": list(src), "clip_ids": clips[node_id]}
        metas.append(meta)
    texts = MemoryStore(out.ids, out.texts, out.embeddings, out.timestamps, tenants, out.sources, metas,
                        out.embedder, keys=out.keys)
    s, t, w, internal = fold_edges(graph.source, graph.target, graph.weight, res.merges)
    g = MemoryGraph(texts, types, [dict(e) for e in graph.entities], s, t, w)
    return GraphCompressResult(g, res.report, res.merges, internal,
                               {"edges_in": len(graph.source), "edges_out": len(s), "internal_edges": internal})


def _streammeco(graph: MemoryGraph, cfg: CompressConfig) -> GraphCompressResult:
    """StreamMeCo on the text nodes (scopes: tenant and node type; entity links: the edges
    between a text node and an entity node, weights summed); edges of removed nodes dropped."""

    st = graph.texts
    row = {i: j for j, i in enumerate(st.ids)}
    ents = {e["id"] for e in graph.entities}
    weight = np.zeros(len(st), dtype=np.float64)
    linked = np.zeros(len(st), dtype=bool)
    for s, t, w in zip(graph.source, graph.target, graph.weight.tolist()):
        for a, b in ((s, t), (t, s)):
            if a in row and b in ents:
                weight[row[a]] += w
                linked[row[a]] = True
    scope = np.unique([f"{t}{_SEP}{ty}" for t, ty in zip(st.tenants, graph.types)], return_inverse=True)[1]
    keyed = MemoryStore(st.ids, st.texts, st.embeddings, st.timestamps, list(map(str, scope)), st.sources,
                        st.metadata, st.embedder)
    protected = kept_mask(st.columns()["texts"], cfg.merge.keep_pattern) if cfg.merge.keep_pattern \
        else np.zeros(len(st), dtype=bool)
    group = group_codes(st, cfg.merge.merge_within) if cfg.merge.merge_within else None
    timer = StageTimer()
    keep, short = streammeco_keep(st.embeddings, scope, weight, linked, group, protected, ratio=cfg.merge.ratio,
                                  seed=cfg.merge.seed, max_iter=cfg.partition.max_iter,
                                  unit=np.unique(st.tenants, return_inverse=True)[1])
    rows = np.flatnonzero(keep).tolist()
    texts = st.take(rows)
    gone = set(st.ids) - set(texts.ids)
    report = prune_report(keyed, keyed.take(rows), "streammeco", timer, protected,
                          {str(s): v for s, v in short.items() if v})
    names = {str(c): f"{t}/{ty}" for c, t, ty in zip(scope.tolist(), st.tenants, graph.types)}
    report.tenants = [dataclasses.replace(r, tenant=names[r.tenant]) for r in report.tenants]  # "video-1/episodic"
    edges = [(s, t, w) for s, t, w in zip(graph.source, graph.target, graph.weight.tolist())
             if s not in gone and t not in gone]
    g = MemoryGraph(texts, [graph.types[j] for j in rows], [dict(e) for e in graph.entities],
                    [e[0] for e in edges], [e[1] for e in edges], np.array([e[2] for e in edges], dtype=np.float64))
    return GraphCompressResult(g, report, [], 0, {"edges_in": len(graph.source), "edges_out": len(edges),
                                                  "internal_edges": 0, "edges_dropped": len(graph.source) - len(edges),
                                                  "removed": len(gone)})


def _number(x: float):
    return int(x) if float(x).is_integer() else float(x)


# --------------------------------------------------------------------------- files
def read_graph(path: str | os.PathLike, *, format: str | None = None, embedder=None, device=None) -> MemoryGraph:
    """Read a graph from JSONL or Parquet (by suffix, or ``format``)."""
    path = os.fspath(path)
    fmt = detect_format(path, format)
    if not os.path.exists(path):
        raise FileNotFoundError(f"graph file not found: {path!r}")
    recs = _read_parquet(path) if fmt == "parquet" else iter_jsonl_objects(path)
    nodes, entities, src, dst, w = [], [], [], [], []
    for where, r in recs:
        kind = r.get("kind")
        extra = sorted(set(r) - set(_FIELDS.get(kind, r)))
        if extra:
            raise ValueError(f"{path}: {where}: fields of a {kind} must be among {list(_FIELDS[kind])}, "
                             f"got unknown {extra}")
        if kind == "node":
            if not isinstance(r.get("id"), (str, int)) or isinstance(r.get("id"), bool) or str(r.get("id")) == "":
                raise ValueError(f"{path}: {where}: node id must be a non-empty string, got {r.get('id')!r}")
            if r.get("text") is not None:
                nodes.append(r)
            else:
                entities.append({k: v for k, v in r.items() if k not in ("kind", "text") and v is not None})
                entities[-1]["id"] = str(r["id"])
        elif kind == "edge":
            for key in ("source", "target"):
                if r.get(key) is None:
                    raise ValueError(f"{path}: {where}: edge is missing required field {key!r}")
            wt = r.get("weight", 1.0)
            if isinstance(wt, bool) or not isinstance(wt, (int, float)) or not np.isfinite(wt):
                raise ValueError(f"{path}: {where}: edge weight must be a finite number, got {wt!r}")
            src.append(str(r["source"]))
            dst.append(str(r["target"]))
            w.append(float(wt))
        else:
            raise ValueError(f"{path}: {where}: kind must be one of ['node', 'edge'], got {kind!r}")
    texts = None
    if nodes:
        try:
            texts = MemoryStore.from_records(
                [{"id": n["id"], "text": n["text"], "timestamp": n.get("timestamp"), "embedding": n.get("embedding"),
                  "tenant": n.get("tenant"), "sources": n.get("sources"), "metadata": n.get("metadata")}
                 for n in nodes], embedder=embedder, device=device)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from e
    types = [str(n.get("type") or "text") for n in nodes]
    g = MemoryGraph(texts, types, entities, src, dst, np.array(w, dtype=np.float64))
    ids = list(texts.ids if texts is not None else []) + [e["id"] for e in entities]
    if len(set(ids)) != len(ids):
        seen: set[str] = set()
        dup = next(i for i in ids if i in seen or seen.add(i))
        raise ValueError(f"{path}: node ids must be unique, got duplicate id {dup!r}")
    known = set(ids)
    for s, t in zip(src, dst):
        for end in (s, t):
            if end not in known:
                raise ValueError(f"{path}: edge endpoints must be node ids, got edge {s!r} -> {t!r} "
                                 f"with unknown {end!r}")
    return g


def _records(graph: MemoryGraph) -> list[dict]:
    out = []
    if graph.texts is not None:
        for r, ty in zip(graph.texts.records(), graph.types):
            r["timestamp"] = _number(r["timestamp"])
            out.append({"kind": "node", "id": r["id"], "type": ty, "text": r["text"], "timestamp": r["timestamp"],
                        "embedding": r["embedding"], "tenant": r["tenant"],
                        "sources": r["sources"], "metadata": r["metadata"]})
    for e in graph.entities:
        out.append({"kind": "node", **e})
    for s, t, w in zip(graph.source, graph.target, graph.weight.tolist()):
        out.append({"kind": "edge", "source": s, "target": t, "weight": w})
    return out


def write_graph(graph: MemoryGraph, path: str | os.PathLike, *, format: str | None = None) -> None:
    """Write atomically as JSONL or Parquet (by suffix, or ``format``)."""
    path = os.fspath(path)
    fmt = detect_format(path, format)
    recs = _records(graph)
    if fmt == "jsonl":
        with atomic_open(path) as f:
            for r in recs:
                f.write((json.dumps(r, ensure_ascii=False) + "\n").encode("utf-8"))
        return

    def col(key):
        return [r.get(key) for r in recs]

    table = pa.table({
        "kind": pa.array(col("kind"), pa.string()),
        "id": pa.array([None if r.get("id") is None else str(r["id"]) for r in recs], pa.string()),
        "type": pa.array(col("type"), pa.string()),
        "text": pa.array(col("text"), pa.string()),
        "timestamp": pa.array([None if r.get("timestamp") is None else float(r["timestamp"]) for r in recs],
                              pa.float64()),
        "embedding": pa.array(col("embedding"), pa.list_(pa.float32())),
        "tenant": pa.array(col("tenant"), pa.string()),
        "sources": pa.array(col("sources"), pa.list_(pa.string())),
        "metadata": pa.array([None if r.get("metadata") is None else json.dumps(r["metadata"], ensure_ascii=False)
                              for r in recs], pa.string()),
        "source": pa.array(col("source"), pa.string()),
        "target": pa.array(col("target"), pa.string()),
        "weight": pa.array(col("weight"), pa.float64()),
    })
    with atomic_open(path) as f:
        pq.write_table(table, f, compression="zstd")


def _read_parquet(path: str):
    try:
        table = pq.read_table(path)
    except Exception as e:  # noqa: BLE001 - arrow raises many types for a bad file
        raise ValueError(f"{path}: cannot read as Parquet: {e}") from None
    if "kind" not in table.column_names:
        raise ValueError(f"{path}: missing required column 'kind' (columns: {table.column_names})")
    for n, r in enumerate(table.to_pylist()):
        r = {k: v for k, v in r.items() if v is not None}
        if isinstance(r.get("metadata"), str):
            try:
                r["metadata"] = json.loads(r["metadata"])
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: row {n}: metadata is not valid JSON: {e}") from None
        if r.get("kind") == "node" and isinstance(r.get("timestamp"), float):
            r["timestamp"] = _number(r["timestamp"])
        yield f"row {n}", r
