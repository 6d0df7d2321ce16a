"""What an M3-Agent graph must hold before it is compressed, each problem named by the file, the
node or edge, and the field: every text node's ``embeddings`` are vectors of finite numbers of
one dimension, and every reference to a node (``text_nodes``, ``text_nodes_by_clip``,
``event_sequence_by_clip``, both ends of an edge) names a node of the graph. M3-Agent itself
would fail on such a graph (``search_text_nodes`` and ``get_connected_nodes`` look every
reference up), and compressing it would carry the broken references into the output."""
from __future__ import annotations

import math

import numpy as np

__all__ = ["check_video_graph"]


def _kind(value) -> str:
    return {dict: "an object", list: "a list", tuple: "a tuple", str: "a string", type(None): "None",
            bool: "a boolean"}.get(type(value), "a number" if isinstance(value, (int, float)) else type(value).__name__)


def _show(value, n: int = 60) -> str:
    r = repr(value)
    return r if len(r) <= n else r[:n - 3] + "..."


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _known(x, nodes: dict) -> bool:
    try:
        return x in nodes
    except TypeError:  # an unhashable value names no node
        return False


def _check_vectors(nid, emb, where: str) -> None:
    """A text node's vectors: one array of finite numbers (numpy's test); the Python walk only
    finds what is wrong in one that is not."""
    try:
        e = np.asarray(emb, dtype=np.float64)
        if e.ndim in (1, 2) and e.size and np.isfinite(e).all():
            return
    except (ValueError, TypeError):
        pass

    def fail(got: str):
        raise ValueError(f"{where}: embeddings of text node {nid!r} must be a non-empty list of vectors (lists of "
                         f"finite numbers) of one dimension, got {got}")

    if not isinstance(emb, list) or not emb:
        fail(f"{_kind(emb)} {_show(emb)}")
    vectors = [emb] if all(_number(x) for x in emb) else emb  # one flat vector is read as one
    for j, v in enumerate(vectors):
        if not isinstance(v, list) or not v:
            fail(f"{_kind(v)} {_show(v)} as vector {j}")
        bad = [x for x in v if not _number(x)]
        if bad:
            fail(f"{_kind(bad[0])} {_show(bad[0])} in vector {j}")
        if len(v) != len(vectors[0]):
            fail(f"vector {j} of {len(v)} numbers after one of {len(vectors[0])}")
    fail(_show(emb))


def _check_ids(field: str, ids, nodes: dict, where: str) -> None:
    if not isinstance(ids, list):
        raise ValueError(f"{where}: {field} must be a list of node ids, got {_kind(ids)} {_show(ids)}")
    for x in ids:
        if not _known(x, nodes):
            raise ValueError(f"{where}: {field} must name nodes of the graph, got {x!r}, which is not one")


def check_video_graph(g, where: str, text_types=("episodic", "semantic")) -> None:
    """Refuse (``ValueError`` naming ``where``, the node or edge and the field) a graph whose text
    nodes' vectors or whose references are broken (module docstring)."""
    nodes = g.nodes
    for nid, node in nodes.items():
        if node.type in text_types:
            _check_vectors(nid, node.embeddings, where)
    _check_ids("text_nodes", g.text_nodes, nodes, where)
    for key in ("text_nodes_by_clip", "event_sequence_by_clip"):
        clips = getattr(g, key)
        if not isinstance(clips, dict):
            raise ValueError(f"{where}: {key} must be an object {{clip: [node ids]}}, got {_kind(clips)} "
                             f"{_show(clips)}")
        for clip, ids in clips.items():
            _check_ids(f"{key}[{clip!r}]", ids, nodes, where)
    if not isinstance(g.edges, dict):
        raise ValueError(f"{where}: edges must be an object {{(id1, id2): weight}}, got {_kind(g.edges)} "
                         f"{_show(g.edges)}")
    for edge, w in g.edges.items():
        if not isinstance(edge, tuple) or len(edge) != 2:
            raise ValueError(f"{where}: edges must be keyed by (id1, id2) pairs, got {_show(edge)}")
        for x in edge:
            if not _known(x, nodes):
                raise ValueError(f"{where}: edge {edge!r} must join two nodes of the graph, got {x!r}, which is not "
                                 "one")
        if not _number(w):
            raise ValueError(f"{where}: the weight of edge {edge!r} must be a finite number, got {_kind(w)} {_show(w)}")
