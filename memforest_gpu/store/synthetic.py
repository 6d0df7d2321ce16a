"""Synthetic memory stores that look like agent memories, for tests and benchmarks.

Embeddings are clustered (topics) with temporal drift: each tenant moves through topics
over time, so nearby memories in time tend to share a topic, as in real conversations.
Texts are short distinct sentences, so the extractive merger has real work to do.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from .atomic import atomic_open
from .memory_store import MemoryStore

__all__ = ["synthetic_store", "heavy_tailed_sizes", "few_tenant_sizes", "write_synthetic_parquet"]

_SUBJ = ["Alice", "Bob", "The user", "Chen", "Dana", "Eli", "Farah", "Gus"]
_VERB = ["visited", "bought", "mentioned", "planned", "cooked", "read about", "fixed", "booked"]
_OBJ = ["a bakery", "a red bike", "the museum", "a trip to Porto", "a new laptop", "ramen", "a concert",
        "a marathon plan", "the garden", "a violin lesson", "a job offer", "a cat named Miso"]


def synthetic_store(n: int, *, tenants: int = 1, dim: int = 384, topics_per_tenant: int | None = None,
                    noise: float = 0.35, big_tenant_share: float = 0.0, seed: int = 0,
                    start: float = 1.6e9, device=None) -> MemoryStore:
    """A store of ``n`` nodes over ``tenants`` tenants. ``big_tenant_share`` puts that
    fraction of all nodes into tenant 0 (one big tenant among many small ones).

    Shape: -> MemoryStore with embeddings (n, dim)
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n!r}")
    if tenants < 1 or tenants > n:
        raise ValueError(f"tenants must be in [1, n={n}], got {tenants!r}")
    rng = np.random.default_rng(seed)
    if big_tenant_share > 0 and tenants > 1:
        n_big = int(round(n * big_tenant_share))
        rest = np.full(tenants - 1, (n - n_big) // (tenants - 1))
        rest[: (n - n_big) - rest.sum()] += 1
        sizes = np.concatenate([[n_big], rest])
    else:
        sizes = np.full(tenants, n // tenants)
        sizes[: n - sizes.sum()] += 1
    ids, texts, ts, ten = [], [], [], []
    embs = []
    for t, size in enumerate(sizes.tolist()):
        if size == 0:
            continue
        n_topics = topics_per_tenant or max(1, size // 40)
        centres = rng.standard_normal((n_topics, dim)).astype(np.float32)
        # a walk through topics: stay on a topic for a while, then move on (sometimes back)
        topic = np.zeros(size, dtype=np.int64)
        cur = 0
        for i in range(size):
            if rng.random() < 0.08:
                cur = int(rng.integers(n_topics))
            topic[i] = cur
        e = centres[topic] + noise * rng.standard_normal((size, dim)).astype(np.float32)
        embs.append(e)
        gaps = rng.exponential(3600.0, size) + np.where(rng.random(size) < 0.05, 86400.0 * 7, 0.0)
        ts.extend((start + np.cumsum(gaps)).tolist())
        for i in range(size):
            s, v, o = _SUBJ[rng.integers(len(_SUBJ))], _VERB[rng.integers(len(_VERB))], _OBJ[rng.integers(len(_OBJ))]
            texts.append(f"{s} {v} {o} (note {i}, topic {int(topic[i])}).")
            ids.append(f"t{t}-{i}")
            ten.append(f"tenant-{t}")
    emb = torch.from_numpy(np.concatenate(embs, 0))
    return MemoryStore.from_columns(ids=ids, texts=texts, timestamps=ts, embeddings=emb, tenants=ten, device=device)


def heavy_tailed_sizes(n_nodes: int, n_tenants: int, seed: int = 0, *, shape: float = 1.1) -> np.ndarray:
    """Tenant sizes from a Pareto law of index ``shape``: most tenants small, a few very
    large (at 1,000,000 nodes over 100,000 tenants: median 3, about 98% under 50, a few
    over 5,000). Every tenant has at least one node and the sizes sum to ``n_nodes``
    exactly (largest remainder). Shape: -> (n_tenants,) int64
    """
    if n_tenants < 1 or n_nodes < n_tenants:
        raise ValueError(f"n_tenants must be in [1, n_nodes={n_nodes}], got {n_tenants!r}")
    if shape <= 0:
        raise ValueError(f"shape must be > 0, got {shape!r}")
    w = np.random.default_rng(seed).pareto(shape, n_tenants) + 1.0  # classic Pareto, minimum 1
    extra = n_nodes - n_tenants
    share = w / w.sum() * extra
    sizes = np.floor(share).astype(np.int64)
    left = extra - int(sizes.sum())
    if left:
        sizes[np.argsort(-(share - sizes), kind="stable")[:left]] += 1
    return sizes + 1


def few_tenant_sizes(n_nodes: int, n_tenants: int = 8, big_share: float = 0.5) -> np.ndarray:
    """``synthetic_store``'s sizes: one tenant holding ``big_share`` of the nodes, the rest
    split evenly. Shape: -> (n_tenants,) int64"""
    if n_tenants < 1 or n_nodes < n_tenants:
        raise ValueError(f"n_tenants must be in [1, n_nodes={n_nodes}], got {n_tenants!r}")
    if big_share > 0 and n_tenants > 1:
        n_big = int(round(n_nodes * big_share))
        rest = np.full(n_tenants - 1, (n_nodes - n_big) // (n_tenants - 1))
        rest[: (n_nodes - n_big) - rest.sum()] += 1
        return np.concatenate([[n_big], rest]).astype(np.int64)
    sizes = np.full(n_tenants, n_nodes // n_tenants, dtype=np.int64)
    sizes[: n_nodes - sizes.sum()] += 1
    return sizes


def write_synthetic_parquet(path: str, sizes, *, dim: int = 384, seed: int = 0, noise: float = 0.35,
                            start: float = 1.6e9, batch_rows: int = 65536) -> int:
    """Write a synthetic store with these tenant ``sizes`` (nodes per tenant) to a Parquet
    file in the layout of :func:`~memforest_gpu.store.io.write_store`, one row group of at most
    ``batch_rows`` rows at a time, never holding the whole store (5,000,000 nodes at
    D = 384 are 7.7 GB of vectors). Same kind of data as :func:`synthetic_store` (topics
    walked over time, unit vectors, distinct short texts), not the same values. Returns
    the number of rows written.
    """

    sizes = np.asarray(sizes, dtype=np.int64)
    if batch_rows < 1:
        raise ValueError(f"batch_rows must be >= 1, got {batch_rows!r}")
    schema = pa.schema([("id", pa.string()), ("text", pa.string()), ("embedding", pa.list_(pa.float32(), dim)),
                        ("timestamp", pa.float64()), ("tenant", pa.string()), ("sources", pa.list_(pa.string())),
                        ("metadata", pa.string())])
    rng = np.random.default_rng(seed)
    cols: dict[str, list] = {k: [] for k in ("id", "text", "emb", "ts", "tenant")}
    pending = 0
    written = 0

    def flush(w):
        nonlocal pending, written
        if not pending:
            return
        emb = np.concatenate(cols["emb"])
        ids = [x for c in cols["id"] for x in c]
        table = pa.Table.from_arrays([
            pa.array(ids, type=pa.string()), pa.array([x for c in cols["text"] for x in c], type=pa.string()),
            pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), dim), pa.array(np.concatenate(cols["ts"])),
            pa.array([x for c in cols["tenant"] for x in c], type=pa.string()),
            pa.array([[x] for x in ids], type=pa.list_(pa.string())),
            pa.array(["{}"] * len(ids), type=pa.string())], schema=schema)
        w.write_table(table)
        written += len(ids)
        for c in cols.values():
            c.clear()
        pending = 0

    subj, verb, obj = np.array(_SUBJ), np.array(_VERB), np.array(_OBJ)
    with atomic_open(path) as f, pq.ParquetWriter(f, schema, compression="zstd") as w:
        for t, size in enumerate(sizes.tolist()):
            n_topics = max(1, size // 40)
            centres = rng.standard_normal((n_topics, dim)).astype(np.float32)
            jump = rng.random(size) < 0.08  # a walk through topics, as in synthetic_store
            jump[0] = True
            new = np.where(jump, rng.integers(n_topics, size=size), 0)
            new[0] = 0
            topic = new[np.maximum.accumulate(np.where(jump, np.arange(size), 0))]
            gaps = rng.exponential(3600.0, size) + np.where(rng.random(size) < 0.05, 86400.0 * 7, 0.0)
            ts = start + np.cumsum(gaps)
            words = rng.integers(0, [len(_SUBJ), len(_VERB), len(_OBJ)], size=(size, 3))
            for lo in range(0, size, batch_rows):
                hi = min(size, lo + batch_rows)
                e = centres[topic[lo:hi]] + noise * rng.standard_normal((hi - lo, dim)).astype(np.float32)
                e /= np.linalg.norm(e, axis=1, keepdims=True)
                cols["emb"].append(e.astype(np.float32))
                cols["ts"].append(ts[lo:hi])
                cols["id"].append([f"t{t}-{i}" for i in range(lo, hi)])
                s, v, o = subj[words[lo:hi, 0]], verb[words[lo:hi, 1]], obj[words[lo:hi, 2]]
                cols["text"].append([f"{a} {b} {c} (note {i}, topic {k})." for a, b, c, i, k in
                                     zip(s.tolist(), v.tolist(), o.tolist(), range(lo, hi), topic[lo:hi].tolist())])
                cols["tenant"].append([f"tenant-{t}"] * (hi - lo))
                pending += hi - lo
                if pending >= batch_rows:
                    flush(w)
        flush(w)
    return written
