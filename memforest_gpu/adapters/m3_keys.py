"""What an M3-Agent text node can hold of a merged node's keys (:mod:`memforest_gpu.store.keys`).

An M3-Agent text node holds a list of vectors and M3-Agent's ``search_text_nodes`` scores a
node by the best of them (``mode="max"``, the mode ``retrieve_from_videograph`` uses). So a
merged node is written with ``embeddings = [its text's vector, key 1, ..., key k]`` and
``metadata["key_sources"]`` (the original ids each key stands for): M3-Agent then finds it by
the best of its text and its keys. It cannot blend the two, so the store's ``text_weight`` does
not carry over: M3-Agent's own max rule is what it holds.

``search_text_nodes`` turns the lists into one array, so every text node of a graph gets the
same number of vectors: a shorter list is padded by repeating its last vector (which changes no
maximum). That count is **bounded** (:func:`vector_bound`), so that the compressed graph holds
no more vectors than the input graph: by default ``b = max(1, floor(input text-node vectors /
output text nodes))`` (``"auto"``; an M3-Agent graph of one vector per node: 1 at ratio 0.5, 3
at 0.7), or a number the user gives, or ``"all"`` (no bound: every key, padded to the longest
list; the graph may grow). A node holding more than ``b`` vectors keeps its text vector and
``b - 1`` centres of its keys (:func:`bound_keys`: a weighted spherical k-means, each centre
standing for the sources of its keys, so the node's keys still hold each of its sources
once); with ``b = 1`` its text vector alone, without ``key_sources`` (:func:`fit_node`).
A node M3-Agent adds later holds one vector, so a graph that keeps growing after compression
should be compressed with ``--keys 0`` (one vector per node, as before).

Read back (:func:`read_keys`), a node with ``key_sources`` gives its text vector
(``embeddings[0]``) and its keys, so compressing a compressed graph again keeps them.
"""
from __future__ import annotations

import numpy as np
import torch

from ..store.keys import NodeKeys
from ..store.merged_keys import centres

__all__ = ["node_vectors", "pad_text_nodes", "read_keys", "vector_bound", "check_vectors", "bound_keys",
           "fit_node", "VECTOR_MODES"]

#: the bounds that are not a number: "auto" (follows the ratio) and "all" (none)
VECTOR_MODES = ("auto", "all")


def check_vectors(value) -> None:
    """``vectors`` must be an integer >= 1, ``"auto"`` or ``"all"``."""
    if value in VECTOR_MODES:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"vectors must be an integer >= 1, 'auto' or 'all', got {value!r}")


def vector_bound(vectors, vectors_in: int, text_out: int) -> int | None:
    """The vectors a text node may hold: ``vectors`` itself when a number, ``max(1,
    vectors_in // text_out)`` for ``"auto"`` (so that ``text_out`` nodes of that many hold at
    most ``vectors_in``), None for ``"all"`` (no bound)."""
    check_vectors(vectors)
    if vectors == "all":
        return None
    if vectors == "auto":
        return max(1, int(vectors_in) // max(1, int(text_out)))
    return int(vectors)


def node_vectors(text_vec: np.ndarray, keys: NodeKeys | None, j: int) -> tuple[list, list | None]:
    """The ``embeddings`` list of output node ``j`` and its ``key_sources`` (None without keys)."""
    if keys is None or keys.counts[j] == 0:
        return [text_vec.tolist()], None
    lo, hi = int(keys.offsets[j]), int(keys.offsets[j + 1])
    kv = keys.unit(torch.arange(lo, hi, device=keys.vectors.device)).detach().cpu().double().numpy()
    return [text_vec.tolist(), *kv.tolist()], keys.sources.slice(lo, hi - lo).to_pylist()


def bound_keys(keys: np.ndarray, sources: list, k: int) -> tuple[np.ndarray, list]:
    """At most ``k`` keys of one node: its keys when it has at most ``k``, else ``k`` centres
    of them (:func:`~memforest_gpu.store.merged_keys.centres`: a key weighs its number of
    sources; deterministic, ties to the lower index), each the normalised weighted mean of its
    keys (a key alone: kept exactly) and standing for their sources, in key order. A centre
    that keeps no key is dropped.

    Shape: keys (K, D), sources K id lists, k >= 1 -> (k', D) with k' <= min(k, K), k' id lists
    """
    if k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    if len(keys) <= k:
        return keys, sources
    w = np.array([max(1, len(s)) for s in sources], dtype=np.float64)  # (K,)
    x = torch.as_tensor(keys, dtype=torch.float32)
    lab = centres(x[None], torch.as_tensor(w, dtype=torch.float32)[None], k)[0].numpy()  # (K,)
    vecs, srcs = [], []
    for c in np.unique(lab).tolist():  # ascending: the centres that kept a key, renumbered
        at = np.flatnonzero(lab == c)
        v = keys[at[0]] if len(at) == 1 else (keys[at] * w[at, None]).sum(0)
        vecs.append(v / (np.linalg.norm(v) or 1.0))
        srcs.append([x for i in at.tolist() for x in sources[i]])
    return np.stack(vecs), srcs


def _distinct(emb: np.ndarray) -> np.ndarray:
    """An unkeyed node's vectors without the padding (trailing repeats of its last vector).
    Shape: (E, D) -> (E', D), E' >= 1"""
    e = len(emb)
    while e > 1 and np.array_equal(emb[e - 1], emb[e - 2]):
        e -= 1
    return emb[:e]


def fit_node(embeddings: list, key_sources: list | None, bound: int | None) -> tuple[list, list | None]:
    """A text node's ``embeddings`` and ``key_sources`` in at most ``bound`` vectors (None:
    any number), padding dropped: a keyed node keeps its text vector and at most ``bound - 1``
    keys (:func:`bound_keys`; ``bound`` 1: the text vector alone, no ``key_sources``); a node
    without keys keeps its distinct vectors, or their normalised mean when they are more than
    ``bound`` (the vector it is compressed by). Shape: E vectors of D -> at most ``bound``"""
    emb = np.asarray(embeddings, dtype=np.float64)
    if emb.ndim == 1:
        emb = emb[None]
    if not key_sources:
        d = _distinct(emb)
        if bound is None or len(d) <= bound:
            return d.tolist(), None
        m = d.mean(0)
        return [(m / (np.linalg.norm(m) or 1.0)).tolist()], None
    keys, srcs = emb[1:1 + len(key_sources)], list(key_sources)
    if bound is not None:
        if bound == 1:
            return [emb[0].tolist()], None
        keys, srcs = bound_keys(keys, srcs, bound - 1)
    return [emb[0].tolist(), *keys.tolist()], srcs


def pad_text_nodes(nodes: dict, text_types, make_node, bound: int | None = None) -> int:
    """Give every text node of ``nodes`` (id -> node) the same number of vectors: each fitted
    to at most ``bound`` (:func:`fit_node`; None: no bound), then padded to the longest list
    by repeating its last vector. A node that changes is replaced by a copy made with
    ``make_node(node, embeddings, metadata)``. Returns that count (<= ``bound``)."""
    text = [i for i, n in nodes.items() if n.type in text_types]
    fitted = {i: fit_node(nodes[i].embeddings, nodes[i].metadata.get("key_sources"), bound) for i in text}
    e = max((len(v[0]) for v in fitted.values()), default=1)
    for i in text:
        node, (emb, ks) = nodes[i], fitted[i]
        emb = emb + [emb[-1]] * (e - len(emb))
        if ks == node.metadata.get("key_sources") and len(emb) == len(node.embeddings) and \
                np.array_equal(np.asarray(emb), np.asarray(node.embeddings, dtype=np.float64)):
            continue  # as it came
        meta = {k: v for k, v in node.metadata.items() if k != "key_sources"}
        if ks:
            meta["key_sources"] = ks
        nodes[i] = make_node(node, emb, meta)
    return e


def read_keys(nodes: list, ids: list[str], vectors: np.ndarray, where: str):
    """The keys the text nodes ``nodes`` hold (``metadata["key_sources"]`` and the vectors after
    the first), as (counts (n,), key vectors (M, D), key sources (M,)), or None when none has any.
    ``vectors``: each node's text vector (its first)."""
    counts, vecs, srcs = np.zeros(len(nodes), dtype=np.int64), [], []
    for j, node in enumerate(nodes):
        ks = node.metadata.get("key_sources")
        if not ks:
            continue
        emb = np.asarray(node.embeddings, dtype=np.float64)
        if not isinstance(ks, list) or emb.ndim != 2 or emb.shape[0] < 1 + len(ks):
            raise ValueError(f"{where}: key_sources of text node {ids[j]!r} must be a list of id lists, one per "
                             f"vector after the first, got {len(ks) if isinstance(ks, list) else ks!r} for "
                             f"{emb.shape[0] if emb.ndim == 2 else 0} vectors")
        counts[j] = len(ks)
        k = emb[1:1 + len(ks)]
        vecs.append(k / np.linalg.norm(k, axis=1, keepdims=True))
        srcs += [[str(x) for x in s] for s in ks]
    if not counts.any():
        return None
    return counts, np.concatenate(vecs).astype(np.float32), srcs
