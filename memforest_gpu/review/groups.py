"""The merged (or planned) nodes of a run, found in one of three ways (:class:`Groups`):

- :func:`groups_from_merges`: a run's merge log (``a + b -> into``, in order); each final
  node's inputs are the nodes its chain of merges started from (the first ``a`` and ``b`` of
  each merge that led to it), its similarity the lowest of its merges';
- :func:`groups_from_plan`: a dry run's first round (``into=None``): one planned pair each;
- :func:`groups_from_stores`: an input and an output store file (``memforest review``): an
  output node stands for the input nodes that hold its ``sources``; its similarity is the
  weakest link between their vectors (the smallest edge of their maximum spanning tree; for
  two inputs, their cosine, as in the merge log).

:func:`load_columns` reads a store file's columns for them without embedding anything.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from ..store import jsonl, parquet
from ..store.io import detect_format
from ..store.keys_io import keys_from_columns
from ..store.memory_store import MemoryStore

__all__ = ["Groups", "groups_from_merges", "groups_from_plan", "groups_from_stores", "load_columns"]


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
    """A store file's columns without embedding anything: the file's vectors (with its keys and
    their codes) when ``vectors`` and it has them, else a 1-dimensional placeholder per node
    (never used)."""
    fmt = detect_format(path, format)
    cols, name = parquet.read_parquet_columns(path) if fmt == "parquet" else jsonl.read_jsonl_columns(path)
    emb = cols["embedding"] if vectors else None
    n = len(cols["id"])
    try:
        st = MemoryStore.from_columns(ids=cols["id"], texts=cols["text"], timestamps=cols["timestamp"],
                                      embeddings=emb if emb is not None else torch.ones(n, 1),
                                      tenants=cols["tenant"], sources=cols["sources"], metadata=cols["metadata"],
                                      embedder=name if emb is not None else None)
        if emb is not None:  # the file's keys and codes, as store/io.py reads them (its size: store/size.py)
            st.keys = keys_from_columns(cols, st, path)
            st.vector_codes = cols.get("vector_codes", "float32")
        return st
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from e


def _rows_of(store: MemoryStore, ids: list[str]) -> np.ndarray:
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
