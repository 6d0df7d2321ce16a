"""What an M3-Agent text node can hold of a merged node's keys (:mod:`memforest_gpu.store.keys`).

An M3-Agent text node holds a list of vectors and M3-Agent's ``search_text_nodes`` scores a
node by the best of them (``mode="max"``, the mode ``retrieve_from_videograph`` uses). So a
merged node is written with ``embeddings = [its text's vector, key 1, ..., key k]`` and
``metadata["key_sources"]`` (the original ids each key stands for): M3-Agent then finds it by
the best of its text and its keys. It cannot blend the two, so the store's ``text_weight`` does
not carry over: M3-Agent's own max rule is what it holds. ``search_text_nodes`` turns the lists
into one array, so every text node of a graph gets the same number of vectors: a shorter list
is padded by repeating its last vector (which changes no maximum). A node M3-Agent adds later
holds one vector, so a graph that keeps growing after compression should be compressed with
``--keys 0`` (one vector per node, as before).

Read back (:func:`read_keys`), a node with ``key_sources`` gives its text vector
(``embeddings[0]``) and its keys, so compressing a compressed graph again keeps them.
"""
from __future__ import annotations

import numpy as np

from ..store.keys import NodeKeys

__all__ = ["node_vectors", "pad_text_nodes", "read_keys"]


def node_vectors(text_vec: np.ndarray, keys: NodeKeys | None, j: int) -> tuple[list, list | None]:
    """The ``embeddings`` list of output node ``j`` and its ``key_sources`` (None without keys)."""
    if keys is None or keys.counts[j] == 0:
        return [text_vec.tolist()], None
    lo, hi = int(keys.offsets[j]), int(keys.offsets[j + 1])
    kv = keys.vectors[lo:hi].detach().cpu().double().numpy()
    return [text_vec.tolist(), *kv.tolist()], keys.sources.slice(lo, hi - lo).to_pylist()


def pad_text_nodes(nodes: dict, text_types, make_node) -> int:
    """Give every text node of ``nodes`` (id -> node, replaced in place by copies made with
    ``make_node(node, embeddings)``) as many vectors as the longest list, repeating each list's
    last vector. Returns that count."""
    text = [i for i, n in nodes.items() if n.type in text_types]
    e = max((len(nodes[i].embeddings) for i in text), default=1)
    for i in text:
        emb = list(nodes[i].embeddings)
        if len(emb) < e:
            nodes[i] = make_node(nodes[i], emb + [emb[-1]] * (e - len(emb)))
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
