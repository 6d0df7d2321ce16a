"""Synthetic memory stores that look like agent memories, for tests and benchmarks.

Embeddings are clustered (topics) with temporal drift: each tenant moves through topics
over time, so nearby memories in time tend to share a topic, as in real conversations.
Texts are short distinct sentences, so the extractive merger has real work to do.
"""
from __future__ import annotations

import numpy as np
import torch

from .store import MemoryStore

__all__ = ["synthetic_store"]

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
