"""M3-Agent memory graphs in their own format: a pickled ``mmagent.videograph.VideoGraph``.

What M3-Agent saves (read in ByteDance-Seed/m3-agent, Apache-2.0: ``mmagent/videograph.py``
``VideoGraph.__init__`` / ``Node`` / ``add_text_node`` / ``add_edge`` / ``search_text_nodes``,
``mmagent/memory_processing.py`` ``process_memories`` and ``mmagent/retrieve.py``
``retrieve_from_videograph``; read through the forks YinpeiDai/m3-agent, xxcs13/M3 and
wht0703/m3-agent, the upstream repository not being in the search index)::

    VideoGraph.nodes                  {id: VideoGraph.Node}      ids are ints from next_node_id
    VideoGraph.Node                   id, type ('img' | 'voice' | 'episodic' | 'semantic'),
                                      embeddings (a list of vectors; one per text node),
                                      metadata {'contents': [text, ...], 'timestamp': clip id}
    VideoGraph.edges                  {(id1, id2): weight}, stored in both directions
    VideoGraph.text_nodes             text node ids in insertion order
    VideoGraph.text_nodes_by_clip     {clip id: [text node ids]}
    VideoGraph.event_sequence_by_clip {clip id: [episodic node ids]}
    next_node_id, max_img_embeddings, max_audio_embeddings, img/audio_matching_threshold,
    and after ``refresh_equivalences`` character_mappings / reverse_character_mappings.

``Node`` is a class nested in ``VideoGraph``, so a pickle names it
``mmagent.videograph`` / ``VideoGraph.Node`` (protocol 4+) or ``getattr(VideoGraph, 'Node')``
(protocols 0-3). :func:`load_video_graph` reads such a pickle **without importing
mmagent**: a restricted unpickler maps exactly those names to the plain classes below and
refuses every other global (a pickle is code). :func:`save_video_graph` writes a pickle
that names M3-Agent's own classes again, so ``pickle.load`` in M3-Agent gives its
``VideoGraph`` back.

:func:`compress_video_graph` compresses the episodic and the semantic nodes of one video
separately (never across types) with :func:`memforest_gpu.adapters.graph.compress_graph`,
under two rules that keep the graph meaning what it meant to M3-Agent (:func:`m3_config`):

- identity lines are never merged: M3-Agent turns its ``Equivalence: <face_0>, <voice_1>.``
  nodes into characters (``refresh_equivalences``, re-run by ``truncate_memory_by_clip`` and
  ``prune_memory_by_node_type``); merging two of them would join two people. They match the
  graph keep rule (``GRAPH_KEEP_PATTERN``, or ``MergeConfig.keep_pattern``) and stay as they are;
- text nodes merge only within one clip (``merge_within="timestamp"``: a text node's
  timestamp is its clip). M3-Agent cuts its memory at any clip c (``truncate_memory_by_clip(c)``
  keeps node ids up to the last text node of clip c; ``search(..., before_clip=c)`` keeps
  clips and node timestamps <= c), so a node holding two clips would be cut with the later
  one or leak it into the earlier one. Inside one clip every cutoff keeps or drops a merged
  node together with all its members, exactly as the uncompressed graph does.

It then writes the result back into the graph: a merged node keeps one id (its earliest
member's, so it sorts inside its clip's id range), ``contents`` = [merged text],
``embeddings`` = [its vector] (with ``merge.keys``: [its vector, its keys...] and
``key_sources``, found by M3-Agent's max over them, :mod:`.m3_keys`), ``timestamp`` = its clip,
plus ``clip_ids`` and ``merged_from`` in its metadata; every edge of its members moves to it
with weights summed (both directions kept; an edge between two members would be a self-loop
and is dropped); ``text_nodes``, ``text_nodes_by_clip`` and ``event_sequence_by_clip`` are
rewritten in order (a merged node where its earliest member was); face and voice nodes,
identity lines and everything else are untouched, and ``next_node_id`` stays above every id.
Every text node holds the same number of vectors, at most a bound (``vectors``; by default
the graph's text nodes hold no more vectors in all than the input's did:
:func:`.m3_keys.vector_bound`); a node holding more keeps its text vector and centres of its
keys, and a shorter list repeats its last vector (an unmerged node is copied, never changed
in place).
"""
from __future__ import annotations

import dataclasses
import io
import os
import pickle
from dataclasses import dataclass, field

import numpy as np

from ..config import CompressConfig, ConfigError
from ..engine import CompressReport
from ..store.atomic import atomic_open
from ..store.keys import NodeKeys
from ..store.memory_store import MemoryStore
from .graph import MemoryGraph, compress_graph, graph_config
from .m3_checks import check_video_graph
from .m3_keys import check_vectors, node_vectors, pad_text_nodes, read_keys, vector_bound

__all__ = ["VideoGraph", "load_video_graph", "save_video_graph", "compress_video_graph", "m3_config",
           "VideoCompressResult", "M3_MODULE", "TEXT_TYPES", "is_m3_agent_path"]

M3_MODULE = "mmagent.videograph"
TEXT_TYPES = ("episodic", "semantic")
_SUFFIXES = (".pkl", ".pickle")


class VideoGraph:
    """M3-Agent's ``VideoGraph`` as plain data: the attributes of the pickle, no methods."""

    class Node:
        """M3-Agent's ``VideoGraph.Node``: ``id``, ``type``, ``embeddings``, ``metadata``."""

        def __init__(self, node_id=None, node_type=None):
            self.id = node_id
            self.type = node_type
            self.embeddings = []
            self.metadata = {}

    def __init__(self):
        self.nodes = {}
        self.edges = {}
        self.text_nodes = []
        self.text_nodes_by_clip = {}
        self.event_sequence_by_clip = {}
        self.next_node_id = 0


_NAMES = {"VideoGraph": VideoGraph, "VideoGraph.Node": VideoGraph.Node}
_QUALNAMES = {cls: name for name, cls in _NAMES.items()}


def is_m3_agent_path(path: str | os.PathLike, format: str | None = None) -> bool:
    """True for ``format="m3-agent"`` (or ``pickle``), or a ``.pkl`` / ``.pickle`` path."""
    if format is not None:
        return str(format).strip().lower() in ("m3-agent", "m3agent", "pickle", "pkl")
    return os.path.splitext(os.fspath(path))[1].lower() in _SUFFIXES


# --------------------------------------------------------------------------- reading
def _safe_getattr(obj, name):
    """``getattr`` as protocols 0-3 use it to reach the nested class, for that case only."""
    if obj is VideoGraph and name == "Node":
        return VideoGraph.Node
    raise ValueError(f"an M3-Agent graph pickle may only use getattr to reach VideoGraph.Node, "
                     f"got getattr({getattr(obj, '__name__', obj)!r}, {name!r})")


class _ObjectToken:
    """What ``builtins.object`` unpickles to: only a marker for :func:`_safe_reconstructor`
    (calling or instantiating it raises)."""

    def __new__(cls, *a, **k):
        raise ValueError("an M3-Agent graph pickle may only use builtins.object as the base of VideoGraph / "
                         "VideoGraph.Node")


def _safe_reconstructor(cls, base, state):
    """``copyreg._reconstructor`` as protocols 0-1 use it, for our two classes only."""
    if cls not in _QUALNAMES or base is not _ObjectToken or state is not None:
        raise ValueError(f"an M3-Agent graph pickle may only reconstruct VideoGraph / VideoGraph.Node, "
                         f"got _reconstructor({cls!r}, {base!r}, ...)")
    return object.__new__(cls)


class _Unpickler(pickle.Unpickler):
    def __init__(self, f, where: str):
        super().__init__(f)
        self.where = where

    def find_class(self, module, name):
        if module == M3_MODULE and name in _NAMES:
            return _NAMES[name]
        if module in ("builtins", "__builtin__") and name == "getattr":
            return _safe_getattr
        if module in ("copyreg", "copy_reg") and name == "_reconstructor":
            return _safe_reconstructor
        if module in ("builtins", "__builtin__") and name == "object":
            return _ObjectToken  # only ever the base argument of _safe_reconstructor
        raise ValueError(f"{self.where}: refusing to load global {module}.{name}: an M3-Agent graph pickle may "
                         f"only reference {M3_MODULE}.VideoGraph and {M3_MODULE}.VideoGraph.Node "
                         "(a pickle is code: nothing else is unpickled)")


def load_video_graph(path: str | os.PathLike) -> VideoGraph:
    """Read an M3-Agent ``VideoGraph`` pickle without importing ``mmagent``; any other
    global in the pickle raises ``ValueError`` naming it, and so does a graph whose text nodes'
    vectors or node references are broken (:mod:`.m3_checks`)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"graph file not found: {path!r}")
    with open(path, "rb") as f:
        try:
            g = _Unpickler(f, path).load()
        except (pickle.UnpicklingError, EOFError) as e:
            raise ValueError(f"{path}: cannot read as a pickle: {e}") from None
    if not isinstance(g, VideoGraph):
        raise ValueError(f"{path}: pickle must hold an {M3_MODULE}.VideoGraph, got {type(g).__name__}")
    for key in ("nodes", "edges", "text_nodes", "text_nodes_by_clip", "event_sequence_by_clip", "next_node_id"):
        if key not in g.__dict__:
            raise ValueError(f"{path}: VideoGraph must have attribute {key!r}, got {sorted(g.__dict__)}")
    for nid, node in g.nodes.items():
        if not isinstance(node, VideoGraph.Node):
            raise ValueError(f"{path}: node {nid!r} must be a VideoGraph.Node, got {type(node).__name__}")
    check_video_graph(g, path, TEXT_TYPES)  # text nodes' vectors, and every reference names a node
    return g


# --------------------------------------------------------------------------- writing
class _Writer(pickle._Pickler):  # the pure-Python pickler: its save_global can be overridden
    def save_global(self, obj, name=None):
        qual = _QUALNAMES.get(obj)
        if qual is None:
            return super().save_global(obj, name)
        self.save(M3_MODULE)
        self.save(qual)
        self.write(pickle.STACK_GLOBAL)
        self.memoize(obj)

    def save_list(self, obj):
        """A vector (a list of Python floats) in one go: the opcodes the pickler would write
        one float at a time (EMPTY_LIST, MARK, BINFLOAT x n, APPENDS per 1000)."""
        if len(obj) < 16 or not all(type(x) is float for x in obj):
            return super().save_list(obj)
        self.write(pickle.EMPTY_LIST)
        self.memoize(obj)
        ops = np.empty((len(obj), 9), dtype=np.uint8)  # (n, 1 + 8): opcode, big-endian float64
        ops[:, 0] = pickle.BINFLOAT[0]
        ops[:, 1:] = np.asarray(obj, dtype=">f8").view(np.uint8).reshape(-1, 8)
        raw = ops.tobytes()
        for i in range(0, len(obj), self._BATCHSIZE):
            self.write(pickle.MARK + raw[i * 9:(i + self._BATCHSIZE) * 9] + pickle.APPENDS)

    dispatch = {**pickle._Pickler.dispatch, list: save_list}


def save_video_graph(graph: VideoGraph, path: str | os.PathLike) -> None:
    """Write ``graph`` atomically as a pickle (protocol 4) that names M3-Agent's own
    ``mmagent.videograph.VideoGraph`` and ``VideoGraph.Node``."""
    buf = io.BytesIO()
    _Writer(buf, protocol=4).dump(graph)
    with atomic_open(os.fspath(path)) as f:
        f.write(buf.getvalue())


# --------------------------------------------------------------------------- compress
@dataclass
class VideoCompressResult:
    graph: VideoGraph
    report: CompressReport
    merged: dict  # kept id -> the ids of this input folded into it (kept id included)
    info: dict = field(default_factory=dict)


def _text_vector(node, where: str) -> np.ndarray:
    e = np.asarray(node.embeddings, dtype=np.float64)
    if e.ndim == 1 and e.size:
        e = e[None]
    if e.ndim != 2 or e.shape[0] == 0:
        raise ValueError(f"{where}: embeddings of text node {node.id!r} must be a non-empty list of vectors, "
                         f"got shape {e.shape}")
    v = e[0] if node.metadata.get("key_sources") else e.mean(axis=0)  # (D,); a keyed node's text vector: its first
    return v / (np.linalg.norm(v) or 1.0)


def _to_memory_graph(g: VideoGraph, tenant: str, where: str) -> tuple[MemoryGraph, dict]:
    ids, texts, emb, ts, types, sources, metas = [], [], [], [], [], [], []
    key_of: dict[str, object] = {}
    for nid, node in g.nodes.items():
        if node.type not in TEXT_TYPES:
            continue
        k = str(nid)
        if k in key_of:
            raise ValueError(f"{where}: node ids must be distinct as text, got {key_of[k]!r} and {nid!r}")
        key_of[k] = nid
        meta = node.metadata
        contents = meta.get("contents")
        if not isinstance(contents, list) or not contents or not all(isinstance(c, str) for c in contents):
            raise ValueError(f"{where}: contents of text node {nid!r} must be a non-empty list of strings, "
                             f"got {contents!r}")
        ids.append(k)
        texts.append(" ".join(contents))
        emb.append(_text_vector(node, where))
        ts.append(meta.get("timestamp"))
        types.append(node.type)
        mf = meta.get("merged_from")
        sources.append([str(x) for x in mf] if isinstance(mf, list) and mf else [k])
        clips = meta.get("clip_ids")
        metas.append({"clip_ids": list(clips)} if isinstance(clips, list) and clips else {})
    if not ids:
        raise ValueError(f"{where}: graph must have at least one episodic or semantic node, got 0")
    try:
        store = MemoryStore.from_columns(ids=ids, texts=texts, timestamps=ts, embeddings=np.stack(emb),
                                         tenants=[tenant] * len(ids), sources=sources, metadata=metas)
        held = read_keys([g.nodes[key_of[k]] for k in ids], ids, np.stack(emb), where)
        if held is not None:  # keys of an earlier compression (m3_keys): kept for the next merges
            store.keys = NodeKeys.from_lists(held[0], held[1], held[2], text_weight=1.0, max_keys=None)
            store.keys.check(store.sources.arrow, store.ids.arrow)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    mg = MemoryGraph(store, types, [], [], [], np.zeros(0, dtype=np.float64))
    return mg, key_of


def m3_config(config: CompressConfig | None) -> CompressConfig:
    """``config`` with M3-Agent's rules (module docstring): the graph keep rule unless
    ``keep_pattern`` names another, and ``merge_within="timestamp"`` (the clip; no other
    grouping is accepted)."""
    cfg = graph_config(config)
    if cfg.merge.merge_within not in (None, "timestamp"):
        raise ConfigError("merge_within", f"must be 'timestamp' (the clip) for an M3-Agent graph, got "
                                          f"{cfg.merge.merge_within!r}: M3-Agent cuts its memory at any clip")
    return dataclasses.replace(cfg, merge=dataclasses.replace(cfg.merge, merge_within="timestamp"))


def compress_video_graph(graph: VideoGraph, config: CompressConfig | None = None, *, merger=None, embedder=None,
                         device=None, progress: bool = False, video: str = "video",
                         vectors: int | str = "auto") -> VideoCompressResult:
    """Compress the text nodes of one M3-Agent graph (episodic and semantic apart, identity
    lines kept, merges within one clip: :func:`m3_config`) and rewrite the graph around the
    merged nodes (see the module docstring). ``graph`` is not modified. ``embedder``: embeds
    merged text (None: the normalised mean of the members' vectors, as for any store whose
    model is not local). ``vectors``: the most vectors a text node holds (a merged node's text
    vector and keys, :mod:`.m3_keys`): ``"auto"`` (no more in all than the input's text nodes
    held), a number >= 1, or ``"all"`` (no bound)."""
    check_vectors(vectors)
    mg, key_of = _to_memory_graph(graph, video, video)
    res = compress_graph(mg, m3_config(config), merger=merger, embedder=embedder, device=device,
                         progress=progress)
    out = res.graph.texts
    # which input nodes each output node holds, by replaying the merge log
    members = {i: [i] for i in mg.texts.ids}
    for m in res.merges:
        members[m.into] = members.pop(m.a) + members.pop(m.b)
    order = {k: j for j, k in enumerate(map(str, graph.nodes))}  # insertion order = id order in M3-Agent
    owner: dict = {}  # input node id -> output node id (original ids, original types)
    merged: dict = {}
    new_nodes: dict = {}
    for j, (i, text, meta) in enumerate(zip(out.ids, out.texts, out.metadata)):
        if len(members[i]) == 1:
            continue
        keys = sorted(members[i], key=order.__getitem__)
        keep = key_of[keys[0]]
        olds = [graph.nodes[key_of[k]] for k in keys]
        for k in keys:
            owner[key_of[k]] = keep
        merged[keep] = [key_of[k] for k in keys]
        node = VideoGraph.Node(keep, olds[0].type)
        node.embeddings, key_src = node_vectors(out.embeddings[j].detach().cpu().double().numpy(), out.keys, j)
        extra: dict = {}
        for o in sorted(olds, key=lambda n: _clip_key(n.metadata.get("timestamp"))):  # newer wins
            extra.update({k: v for k, v in o.metadata.items()
                          if k not in ("contents", "timestamp", "clip_ids", "merged_from")})
        src_ids = {str(x): x for o in olds for x in (o.metadata.get("merged_from") or [o.id])}
        node.metadata = {**extra, "contents": [text], "timestamp": max(o.metadata["timestamp"] for o in olds),
                         "clip_ids": list(meta["clip_ids"]), "merged_from": [src_ids[s] for s in meta["merged_from"]]}
        if key_src is not None:
            node.metadata["key_sources"] = [[src_ids[s] for s in k] for k in key_src]
        new_nodes[keep] = node

    g = VideoGraph.__new__(VideoGraph)
    g.__dict__.update(graph.__dict__)
    g.nodes = {}
    for nid, node in graph.nodes.items():
        o = owner.get(nid, nid)
        if o == nid:
            g.nodes[nid] = new_nodes.get(nid, node)
    vectors_in = sum(len(n.embeddings) for n in graph.nodes.values() if n.type in TEXT_TYPES)
    bound = vector_bound(vectors, vectors_in, len(out))
    per_node = pad_text_nodes(g.nodes, TEXT_TYPES, _with_embeddings, bound)  # search_text_nodes: one count
    edges: dict = {}
    internal = 0
    for (a, b), w in graph.edges.items():
        a2, b2 = owner.get(a, a), owner.get(b, b)
        if a2 == b2 and a != b:
            internal += 1
            continue
        edges[(a2, b2)] = edges[(a2, b2)] + w if (a2, b2) in edges else w
    g.edges = edges

    def remap(seq):
        return list(dict.fromkeys(owner.get(x, x) for x in seq))

    g.text_nodes = remap(graph.text_nodes)
    g.text_nodes_by_clip = {c: remap(v) for c, v in graph.text_nodes_by_clip.items()}
    g.event_sequence_by_clip = {c: remap(v) for c, v in graph.event_sequence_by_clip.items()}
    ints = [x for x in g.nodes if isinstance(x, int) and not isinstance(x, bool)]
    if ints and graph.next_node_id <= max(ints):  # kept ids are old ids: next_node_id stays valid
        raise ValueError(f"next_node_id must be above every node id ({max(ints)}), got {graph.next_node_id!r}")
    info = {"nodes_in": len(graph.nodes), "nodes_out": len(g.nodes), "edges_in": len(graph.edges),
            "edges_out": len(edges), "internal_edges": internal,
            "text_in": len(mg.texts), "text_out": len(out), "merged_nodes": len(merged),
            "text_vectors_in": vectors_in, "text_vectors_out": per_node * len(out), "vectors_per_node": per_node,
            "vector_bound": bound}
    return VideoCompressResult(g, res.report, merged, info)


def _with_embeddings(node, embeddings, metadata):
    """A copy of ``node`` (the input graph is never modified) with other ``embeddings`` and
    ``metadata``."""
    out = VideoGraph.Node(node.id, node.type)
    out.metadata, out.embeddings = metadata, embeddings
    return out


def _clip_key(c):
    return (0, c) if isinstance(c, (int, float)) else (1, str(c))
