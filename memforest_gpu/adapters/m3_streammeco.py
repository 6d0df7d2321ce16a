"""The StreamMeCo baseline on M3-Agent's own graphs (a pickled ``VideoGraph``), and the choice
of method for them (:func:`compress_video`).

StreamMeCo (:mod:`.streammeco`) removes text nodes instead of merging them. On a video graph:
episodic and semantic nodes are pruned apart (like MemForest's merges, never across types),
identity lines (``Equivalence:``, the graph keep rule) are never removed, a text node's entity
links are its edges to face (``img``) and voice nodes (each pair once: M3-Agent stores both
directions), and the sampling groups of isolated nodes are the clips, as in the authors' code.
Every clip keeps a text node of some type (M3-Agent's ``truncate_memory_by_clip`` cuts at the
clip's last text node; identity lines count). The graph is written back without the removed
nodes: their
edges go, and ``text_nodes``, ``text_nodes_by_clip`` and ``event_sequence_by_clip`` lose them
(a clip's list may end empty; its key stays); everything else is untouched.
"""
from __future__ import annotations

import numpy as np

from ..config import CompressConfig
from ..engine.partition import group_codes, kept_mask
from ..store.memory_store import MemoryStore
from ..timer import StageTimer
from .m3agent import VideoCompressResult, VideoGraph, _to_memory_graph, compress_video_graph, m3_config
from .streammeco import StreamMeCoConfig, prune_report, streammeco_keep

__all__ = ["prune_video_graph", "compress_video", "VIDEO_METHODS"]

VIDEO_METHODS = ("memforest", "streammeco")
MEDIA = ("img", "voice")


def _entity_links(graph: VideoGraph, key_of: dict, ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Per text node (in ``ids`` order): the sum of its edge weights to face and voice nodes,
    and whether it has one. Shape: -> (N,) float64, (N,) bool"""
    row = {key_of[k]: j for j, k in enumerate(ids)}
    weight = np.zeros(len(ids), dtype=np.float64)
    linked = np.zeros(len(ids), dtype=bool)
    seen = set()
    for (a, b), w in graph.edges.items():
        pair = frozenset((a, b))
        if pair in seen or a == b:
            continue
        seen.add(pair)
        for t, e in ((a, b), (b, a)):
            if t in row and e in graph.nodes and graph.nodes[e].type in MEDIA:
                weight[row[t]] += float(w)
                linked[row[t]] = True
    return weight, linked


def prune_video_graph(graph: VideoGraph, config: CompressConfig | None = None, *, video: str = "video",
                      streammeco: StreamMeCoConfig | None = None) -> VideoCompressResult:
    """StreamMeCo on one M3-Agent graph (see the module docstring); ``graph`` is not modified."""
    timer = StageTimer()
    cfg = m3_config(config)
    mg, key_of = _to_memory_graph(graph, video, video)
    st = mg.texts
    scope = np.unique(np.asarray(mg.types), return_inverse=True)[1]  # episodic / semantic apart
    weight, linked = _entity_links(graph, key_of, st.ids)
    protected = kept_mask(st.columns()["texts"], cfg.merge.keep_pattern)
    keep, short = streammeco_keep(st.embeddings, scope, weight, linked, group_codes(st, "timestamp"), protected,
                                  ratio=cfg.merge.ratio, seed=cfg.merge.seed, config=streammeco,
                                  max_iter=cfg.partition.max_iter, unit=np.zeros(len(st), dtype=np.int64))
    gone = {key_of[k] for k, kept in zip(st.ids, keep.tolist()) if not kept}
    g = VideoGraph.__new__(VideoGraph)
    g.__dict__.update(graph.__dict__)
    g.nodes = {i: n for i, n in graph.nodes.items() if i not in gone}
    g.edges = {e: w for e, w in graph.edges.items() if e[0] not in gone and e[1] not in gone}
    g.text_nodes = [i for i in graph.text_nodes if i not in gone]
    g.text_nodes_by_clip = {c: [i for i in v if i not in gone] for c, v in graph.text_nodes_by_clip.items()}
    g.event_sequence_by_clip = {c: [i for i in v if i not in gone] for c, v in graph.event_sequence_by_clip.items()}
    typed = MemoryStore(st.ids, st.texts, st.embeddings, st.timestamps, [f"{video}/{ty}" for ty in mg.types],
                        st.sources, st.metadata, st.embedder)  # the report's rows: one per type
    rows = np.flatnonzero(keep).tolist()
    report = prune_report(typed, typed.take(rows), "streammeco", timer, protected,
                          {f"{video}/{mg.types[int(np.flatnonzero(scope == s)[0])]}": v
                           for s, v in short.items() if v})
    info = {"nodes_in": len(graph.nodes), "nodes_out": len(g.nodes), "edges_in": len(graph.edges),
            "edges_out": len(g.edges), "internal_edges": 0, "text_in": len(st), "text_out": len(rows),
            "merged_nodes": 0, "removed": len(gone), "linked_text_nodes": int(linked.sum())}
    return VideoCompressResult(g, report, {}, info)


def compress_video(graph: VideoGraph, config: CompressConfig | None = None, *, method: str = "memforest",
                   merger=None, embedder=None, device=None, progress: bool = False,
                   video: str = "video", vectors: int | str = "auto") -> VideoCompressResult:
    """One M3-Agent graph compressed with ``method`` (:data:`VIDEO_METHODS`): MemForest's merges
    (:func:`~.m3agent.compress_video_graph`, ``vectors``: the most vectors a text node holds) or
    StreamMeCo's pruning (:func:`prune_video_graph`: the nodes it keeps are as they were, so
    ``vectors`` must stay ``"auto"``)."""
    if method not in VIDEO_METHODS:
        raise ValueError(f"method must be one of {list(VIDEO_METHODS)}, got {method!r}")
    if method == "streammeco":
        if vectors != "auto":
            raise ValueError(f"vectors must be 'auto' with method 'streammeco' (it removes nodes and keeps the "
                             f"others as they were), got {vectors!r}")
        return prune_video_graph(graph, config, video=video)
    return compress_video_graph(graph, config, merger=merger, embedder=embedder, device=device, progress=progress,
                                video=video, vectors=vectors)
