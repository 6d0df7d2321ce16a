"""The keys of a compressed store's nodes, made from the store it was compressed from.

Each input node brings **units** (a vector, the original ids it stands for, a weight = their
number): its keys when it has some, else its own vector with its sources (an original: itself;
a merged node of a store without keys: its text's vector). An output node made of one input
node keeps that node's keys (none for an original); a merged output node gathers the units of
its input nodes and keeps them as keys when there are at most ``max_keys`` (``None``: all),
else ``max_keys`` centres of them: a weighted spherical k-means (:func:`centres`), each centre
the normalised weighted mean of its units, standing for their sources. So a key always stands
for originals of its node, and a node's keys together hold each of its sources exactly once,
however often it is merged again (compaction, or compressing a compressed store).

Which input nodes an output node is made of follows from the sources alone (every original
is in exactly one node on either side), so the rule works for any merging method's output.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from ..heap import release_free_heap
from .codes import int8_codes
from .keys import NodeKeys, ranges
from .memory_store import MemoryStore

__all__ = ["derive_keys", "centres", "input_rows", "fold_keys"]

_LLOYD_STEPS = 10
_BLOCK = 1 << 24  # most (B, S, S) similarity entries of one batched k-means
_CODE_ROWS = 1 << 13  # keys gathered in float32 at a time when they are made as int8 codes (12.6 MB at d = 384)


def input_rows(inp: MemoryStore, out_sources: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Which input rows each output node is made of.

    Shape: out_sources (N_out,) list<string> -> offsets (N_out + 1,), rows (R,) int64 (the distinct
    input rows of output node j are ``rows[offsets[j]:offsets[j + 1]]``, in order of first source)
    """
    src = inp.sources.arrow
    flat_in = pc.cast(src.flatten(), pa.large_string())
    row_of = pc.list_parent_indices(src).to_numpy(zero_copy_only=False).astype(np.int64)
    flat_out = pc.cast(out_sources.flatten(), pa.large_string())
    at = pc.index_in(flat_out, value_set=flat_in)
    if at.null_count:
        j = int(np.flatnonzero(at.is_null().to_numpy(zero_copy_only=False))[0])
        raise ValueError(f"sources of the output must be sources of the input store, got {flat_out[j].as_py()!r}")
    rows = row_of[at.to_numpy(zero_copy_only=False).astype(np.int64)]
    owner = pc.list_parent_indices(out_sources).to_numpy(zero_copy_only=False).astype(np.int64)
    # distinct (owner, row) pairs, kept in order of first appearance
    pair = owner * (len(inp) + 1) + rows
    _, first = np.unique(pair, return_index=True)
    first = np.sort(first)
    counts = np.bincount(owner[first], minlength=len(out_sources))
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), rows[first]


def _units(inp: MemoryStore, rows: np.ndarray):
    """The units of input rows ``rows`` (distinct, ascending): (offsets (R + 1,), origin (U,),
    sources (U,), weights (U,)). A unit's vector is not copied here: ``origin`` says where it
    is (:func:`_unit_vectors`)."""
    k = inp.keys
    has = k.counts[rows] > 0 if k is not None else np.zeros(len(rows), dtype=bool)
    counts = np.where(has, k.counts[rows] if k is not None else 0, 1)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    plain = np.flatnonzero(~has)
    origin = np.empty(int(offsets[-1]), dtype=np.int64)  # index into [node sources ; key sources]
    origin[offsets[plain]] = rows[plain]
    if has.any():
        keyed = np.flatnonzero(has)
        at = ranges(offsets[keyed], counts[keyed])
        origin[at] = len(inp) + ranges(k.offsets[rows[keyed]], counts[keyed])
        both = pa.concat_arrays([inp.sources.arrow.cast(pa.large_list(pa.large_string())), k.sources])
    else:
        both = inp.sources.arrow.cast(pa.large_list(pa.large_string()))
    sources = both.take(pa.array(origin, type=pa.int64()))
    weights = pc.list_value_length(sources).to_numpy(zero_copy_only=False).astype(np.float32)
    return offsets, origin, sources, weights


def _unit_vectors(inp: MemoryStore, origin: np.ndarray) -> torch.Tensor:
    """The float32 vectors of units at ``origin`` (an input row, or ``len(inp)`` + a key row of
    the input's keys), gathered once. Shape: origin (S,) host -> (S, D)"""
    dev = inp.embeddings.device
    n = len(inp)
    keyed = origin >= n
    if not keyed.any():
        return inp.embeddings[torch.as_tensor(origin, dtype=torch.int64, device=dev)].float()
    out = torch.empty(len(origin), inp.dim, dtype=torch.float32, device=dev)
    t = lambda a: torch.as_tensor(a, dtype=torch.int64, device=dev)  # noqa: E731
    plain = np.flatnonzero(~keyed)
    out[t(plain)] = inp.embeddings[t(origin[plain])].float()
    at = np.flatnonzero(keyed)
    kv = inp.keys.vectors
    out[t(at)] = inp.keys.unit(torch.as_tensor(origin[at] - n, dtype=torch.int64, device=kv.device)).to(dev)
    return out


def derive_keys(inp: MemoryStore, out_sources: pa.Array, *, max_keys: int | None, text_weight: float,
                device=None, codes: str = "float32", saved=None) -> NodeKeys:
    """The keys of a compressed store whose nodes have ``out_sources``, compressed from ``inp``
    (see the module doc). ``device``: where the keys go (default the input's). ``codes``:
    ``"int8"`` makes the keys int8 codes (:mod:`.codes`), a block of keys at a time (never every
    key in float32 at once). ``saved``: ``[(rows, int8 codes)]`` of input rows whose vectors are
    gone from ``inp.embeddings`` (a run that reused their rows kept their codes first); with
    them, only int8 keys of every source can be made; the list is emptied as its codes are written.

    Shape: out_sources (N_out,) -> NodeKeys of N_out nodes
    """
    if isinstance(out_sources, pa.ChunkedArray):
        out_sources = out_sources.combine_chunks()
    n_out = len(out_sources)
    off, rows = input_rows(inp, out_sources)
    n_in = np.diff(off)  # input rows per output node
    has_in = inp.keys.counts > 0 if inp.keys is not None else np.zeros(len(inp), dtype=bool)
    pair_node = np.repeat(np.arange(n_out), n_in)  # (R,) the output node of each (node, input row) pair
    plain = (n_in == 1)[pair_node] & ~has_in[rows]  # one input row without keys: the node keeps none
    needed, at = np.unique(rows[~plain], return_inverse=True)  # the input rows whose units are read
    u_off, u_origin, u_src, u_w = _units(inp, needed)
    take = np.zeros(len(rows), dtype=np.int64)
    take[~plain] = np.diff(u_off)[at]  # units each pair brings
    first = np.zeros(len(rows), dtype=np.int64)
    first[~plain] = u_off[at]
    unit_rows = ranges(first, take)  # (U_out,) units, grouped by output node
    per_node = np.bincount(pair_node, weights=take, minlength=n_out).astype(np.int64)
    vec, src, counts = _reduce(inp, u_origin, u_src, u_w, unit_rows, per_node, max_keys, codes, saved or None)
    dev = inp.embeddings.device if device is None else device
    return NodeKeys.from_lists(counts, vec.to(dev), src, text_weight=text_weight, max_keys=max_keys)


def fold_keys(out: MemoryStore, keys: NodeKeys) -> MemoryStore:
    """One vector per node: each node of ``out`` with one key ``k`` (a merged node; ``keys`` made
    with ``max_keys=1``: the centre of its sources) gets the unit blend
    ``normalize(w t + (1 - w) k)`` of its text's vector ``t`` and that key as its vector, with
    ``w = keys.text_weight``, and ``out`` keeps no keys. Since a query is one vector,
    ``q . (w t + (1 - w) k)`` is the keys' rule with one key; held as a unit vector like every
    vector of a store, a node's score is that rule over ``|w t + (1 - w) k|`` (at most 1). The
    vectors are changed in place: ``out`` must own them.

    Shape: out (N, D), keys of N nodes with counts <= 1 -> out, every row a unit vector
    """
    counts = keys.counts
    if counts.size and counts.max() > 1:
        raise ValueError(f"keys to fold must be at most one per node, got {int(counts.max())}")
    nodes = np.flatnonzero(counts == 1)  # the keys are in node order: key j is nodes[j]'s
    emb = out.embeddings
    w = float(keys.text_weight)
    for lo in range(0, len(nodes), _CODE_ROWS):
        at = torch.as_tensor(nodes[lo:lo + _CODE_ROWS], dtype=torch.int64, device=emb.device)
        k = keys.unit(torch.arange(lo, lo + len(at), device=keys.vectors.device)).to(emb.device, emb.dtype)
        blend = torch.nn.functional.normalize(w * emb.index_select(0, at) + (1.0 - w) * k, dim=1)  # (B, D)
        emb.index_copy_(0, at, blend)
    out.keys = None
    return out


def _reduce(inp: MemoryStore, u_origin: np.ndarray, u_src: pa.Array, u_w: np.ndarray, unit_rows: np.ndarray,
            per_node: np.ndarray, max_keys: int | None, codes: str = "float32", saved: list | None = None):
    """Each node's units as keys, or ``max_keys`` centres of them. Returns (vectors (M, D),
    sources (M,), keys per node (N_out,))."""
    if max_keys == 1:  # one key per node: the centre of all its units, no k-means to run
        return _gather_keys(inp, u_origin, u_src, u_w, unit_rows, per_node, np.zeros(len(unit_rows), dtype=np.int64),
                            np.minimum(per_node, 1), codes, saved)
    dev = inp.embeddings.device
    node_off = np.concatenate([[0], np.cumsum(per_node)]).astype(np.int64)
    within = np.arange(len(unit_rows)) - np.repeat(node_off[:-1], per_node)  # a unit's place in its node
    key = within.copy()  # each unit's key inside its node: itself, or its centre
    counts = per_node.copy()
    big = np.flatnonzero(per_node > max_keys) if max_keys is not None else np.zeros(0, dtype=np.int64)
    size_class = np.ceil(np.log2(np.maximum(per_node[big], 1))).astype(np.int64)
    blocks = []  # nodes of similar size, at most _BLOCK entries of (B, S, S) similarities and of (B, S, D) vectors
    for c in np.unique(size_class).tolist():
        nodes = big[size_class == c]
        S = int(per_node[nodes].max())
        step = max(1, _BLOCK // (S * max(S, inp.dim)))
        blocks += [nodes[i:i + step] for i in range(0, len(nodes), step)]
    for nodes in blocks:  # one batched k-means per block
        S = int(per_node[nodes].max())
        ok = np.arange(S)[None, :] < per_node[nodes][:, None]  # (B, S)
        at = np.where(ok, node_off[nodes][:, None] + np.arange(S)[None, :], 0)  # (B, S) unit positions
        X = _unit_vectors(inp, u_origin[unit_rows[at]].reshape(-1)).view(*at.shape, -1)  # (B, S, D)
        W = torch.as_tensor(np.where(ok, u_w[unit_rows[at]], 0.0), dtype=torch.float32, device=dev)
        lab = centres(X, W, max_keys).cpu().numpy()  # (B, S)
        present = np.zeros((len(nodes), max_keys), dtype=bool)
        rows_b = np.repeat(np.arange(len(nodes)), ok.sum(1))
        present[rows_b, lab[ok]] = True  # the centres that kept a unit
        rank = np.cumsum(present, axis=1) - 1  # (B, k): empty centres are dropped, the rest renumbered
        key[at[ok]] = rank[rows_b, lab[ok]]
        counts[nodes] = present.sum(1)
    return _gather_keys(inp, u_origin, u_src, u_w, unit_rows, per_node, key, counts, codes, saved)


def _put_saved(vec: torch.Tensor, origin: np.ndarray, saved: list) -> np.ndarray:
    """Write the saved int8 codes of input rows whose vectors are gone (a reusing run kept them
    before it overwrote the rows) into the keys of those rows, taking each block out of
    ``saved`` once written (the caller's list empties: the codes are never held twice, 1M
    nodes: ~190 MB a copy). Returns which keys are still to be coded from ``inp``'s vectors.
    Shape: vec (M, D) int8, origin (M,) each key's input row -> (M,) bool"""
    key_of = np.full(int(origin.max()) + 1 if len(origin) else 0, -1, dtype=np.int64)
    key_of[origin] = np.arange(len(origin))
    todo = np.ones(len(origin), dtype=bool)
    while saved:  # a row is saved once (the put that first overwrote it), so the blocks' order is free
        rows, codes = saved.pop()
        rows = np.asarray(rows, dtype=np.int64)
        ok = rows < len(key_of)
        k = np.where(ok, key_of[np.where(ok, rows, 0)], -1)
        hit = np.flatnonzero(k >= 0)
        c = codes if isinstance(codes, torch.Tensor) else torch.as_tensor(np.asarray(codes))
        vec[torch.from_numpy(k[hit])] = c.cpu()[torch.from_numpy(hit)]
        todo[k[hit]] = False
    return todo


def _gather_keys(inp, u_origin, u_src, u_w, unit_rows, per_node, key, counts, codes="float32", saved=None):
    """Keys in node order: each the normalised weighted mean of its units (a unit alone: its own
    vector, copied once: when every key is a unit alone, as with every source kept, no sum is
    made), with its units' sources in node order."""
    key_off = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    key_of_unit = np.repeat(key_off[:-1], per_node) + key  # (U_out,) output key of each unit
    M = int(key_off[-1])
    alone = np.bincount(key_of_unit, minlength=M)[key_of_unit] == 1
    order = np.argsort(key_of_unit, kind="stable")  # units by key, node order kept inside a key
    if saved is not None and not (alone.all() and codes == "int8"):
        raise ValueError("keys from saved codes are int8 keys of every source")
    if alone.all() and codes == "int8":  # the units' codes, a block of keys at a time
        origin = u_origin[unit_rows[order]]  # (M,) each key's unit
        release_free_heap()  # the unit tables' freed blocks, before the (M, D) codes (1M nodes: ~150 MB)
        vec = torch.empty(M, inp.dim, dtype=torch.int8)
        todo = _put_saved(vec, origin, saved) if saved is not None else None  # (M,) keys still to code
        for lo in range(0, M, _CODE_ROWS):
            if todo is None:
                vec[lo:lo + _CODE_ROWS] = torch.from_numpy(int8_codes(_unit_vectors(inp, origin[lo:lo + _CODE_ROWS])))
                continue
            at = np.flatnonzero(todo[lo:lo + _CODE_ROWS]) + lo
            vec[torch.from_numpy(at)] = torch.from_numpy(int8_codes(_unit_vectors(inp, origin[at])))
    elif alone.all():  # one unit per key: the keys are the units, in key order
        vec = _unit_vectors(inp, u_origin[unit_rows[order]])  # (M, D)
    else:  # weighted sums, a block of keys at a time: never every unit's vector at once, and int8 keys
        # never every key in float32 (1M nodes: ~500 MB)
        vec = _summed_keys(inp, u_origin, u_w, unit_rows, key_of_unit, order, alone, M, codes)
    src = u_src.take(pa.array(unit_rows[order], type=pa.int64()))
    lengths = pc.list_value_length(src).to_numpy(zero_copy_only=False).astype(np.int64)
    per_key = np.bincount(key_of_unit[order], weights=lengths, minlength=M).astype(np.int64)
    flat = pc.cast(src.flatten(), pa.large_string())
    offs = pa.array(np.concatenate([[0], np.cumsum(per_key)]).astype(np.int64), type=pa.int64())
    return vec, pa.LargeListArray.from_arrays(offs, flat), counts


def _summed_keys(inp, u_origin, u_w, unit_rows, key_of_unit, order, alone, M: int, codes: str) -> torch.Tensor:
    """Each key the normalised weighted sum of its units (a unit alone: its own vector, exactly),
    made a block of keys at a time (about ``_CODE_ROWS`` units each, one key at least) and coded to
    int8 by block when ``codes`` is ``"int8"``. A key's units are added in unit order, whatever
    the blocks. Shape: -> (M, D), int8 on the host or float32 on the input's device"""
    dev = inp.embeddings.device
    vec = torch.empty(M, inp.dim, dtype=torch.int8) if codes == "int8" else \
        torch.empty(M, inp.dim, dtype=torch.float32, device=dev)
    ends = np.cumsum(np.bincount(key_of_unit, minlength=M))  # (M,) units of the keys up to each one
    t = lambda a: torch.as_tensor(a, dtype=torch.int64, device=dev)  # noqa: E731
    lo = 0
    while lo < M:
        start = int(ends[lo - 1]) if lo else 0
        hi = max(lo + 1, min(M, lo + _CODE_ROWS, int(np.searchsorted(ends, start + _CODE_ROWS, side="right"))))
        end = int(ends[hi - 1])  # the block's units are order[start:end], by key, in unit order
        acc = torch.zeros(hi - lo, inp.dim, dtype=torch.float32, device=dev)
        for a in range(start, end, _CODE_ROWS):
            u = order[a:min(a + _CODE_ROWS, end)]
            w = torch.as_tensor(u_w[unit_rows[u]], dtype=torch.float32, device=dev)
            acc.index_add_(0, t(key_of_unit[u] - lo), _unit_vectors(inp, u_origin[unit_rows[u]]) * w[:, None])
        acc.div_(acc.norm(dim=1, keepdim=True).clamp_min(1e-12))  # in place: F.normalize's values
        s = order[start:end]
        s = s[alone[s]]
        if len(s):  # a unit alone: kept exactly
            acc[t(key_of_unit[s] - lo)] = _unit_vectors(inp, u_origin[unit_rows[s]])
        vec[lo:hi] = torch.from_numpy(int8_codes(acc)) if codes == "int8" else acc
        lo = hi
    return vec


def centres(X: torch.Tensor, W: torch.Tensor, k: int, *, steps: int = _LLOYD_STEPS) -> torch.Tensor:
    """Weighted spherical k-means of each set of vectors, batched: the label of every vector.

    Start: farthest-point traversal from the heaviest vector (ties: the first); then Lloyd
    steps (a vector goes to its most similar centre, ties to the lower one; a centre is the
    normalised weighted mean of its vectors, an empty one stays where it was). Padding has
    weight 0 and is never chosen as a start.

    Shape: X (B, S, D) unit rows, W (B, S) >= 0 (0 = padding), k <= S -> labels (B, S) int64
    in [0, k)
    """
    B, S, _ = X.shape
    ok = W > 0  # (B, S)
    sim = torch.bmm(X, X.transpose(1, 2))  # (B, S, S)
    first = torch.argmax(W, dim=1)  # heaviest, ties to the first
    chosen = [first]
    best = sim[torch.arange(B, device=X.device), first]  # (B, S) similarity to the nearest chosen
    for _ in range(1, k):
        far = torch.argmin(best.masked_fill(~ok, float("inf")), dim=1)  # ties to the first
        chosen.append(far)
        best = torch.maximum(best, sim[torch.arange(B, device=X.device), far])
    C = X[torch.arange(B, device=X.device)[:, None], torch.stack(chosen, 1)]  # (B, k, D)
    labels = torch.zeros(B, S, dtype=torch.int64, device=X.device)
    for _ in range(steps):
        new = torch.argmax(torch.bmm(X, C.transpose(1, 2)), dim=2)  # (B, S), ties to the lower centre
        onehot = torch.nn.functional.one_hot(new, k).float() * W[:, :, None]  # (B, S, k)
        acc = torch.bmm(onehot.transpose(1, 2), X)  # (B, k, D)
        filled = onehot.sum(1) > 0  # (B, k)
        C = torch.where(filled[:, :, None], torch.nn.functional.normalize(acc, dim=2), C)
        if torch.equal(new, labels):
            break
        labels = new
    return labels
