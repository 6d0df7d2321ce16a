"""Shared helpers of the compaction tests: batches of arriving memories, and the invariants
every compaction must keep (counts, provenance, tenant isolation, untouched tenants, trees)."""
from __future__ import annotations

from collections import Counter

import numpy as np
import torch

from memforest_gpu.config import CompactConfig
from memforest_gpu.store.memory_store import MemoryStore
from memforest_gpu.store.synthetic import synthetic_store

DIM = 16


def arrivals(step: int, n: int, tenants, *, offset: float | None = None) -> list[dict]:
    """``n`` new memories per tenant (synthetic topics), later than every earlier step."""
    off = 1e7 * step if offset is None else offset
    out = []
    for j, t in enumerate(tenants):
        s = synthetic_store(n, dim=DIM, seed=step * 31 + j)
        for i, (text, ts, e) in enumerate(zip(s.texts, s.timestamps.tolist(), s.embeddings)):
            out.append({"id": f"{t}-s{step}-{i}", "text": text, "timestamp": ts + off, "tenant": t,
                        "embedding": e.tolist()})
    return out


def store_of(records: list[dict]) -> MemoryStore:
    return MemoryStore.from_records(records)


def origin_tenants(records: list[dict]) -> dict[str, str]:
    return {r["id"]: r["tenant"] for r in records}


def check_compaction(before: MemoryStore, res, budget: CompactConfig, owner: dict[str, str]) -> None:
    """What every compaction keeps (``owner``: every original id ever added -> its tenant)."""
    out, rep = res.store, res.report
    # provenance: every original in exactly one node's sources
    flat = [x for s in out.sources for x in s]
    assert Counter(flat) == Counter(list(owner)), "every original id must be in exactly one node's sources"
    # tenant isolation: a node holds only its own tenant's originals
    for t, src in zip(out.tenants, out.sources):
        assert {owner[x] for x in src} == {t}
    n_in = Counter(before.tenants)
    n_out = Counter(out.tenants)
    rows = {r["tenant"]: r for r in rep.tenants}
    for t, n in n_in.items():
        b = budget.max_nodes_of(t)
        if b is not None and n > b:  # compacted: exactly keep, or the shortfall said
            assert n_out[t] == budget.target(t) + rows[t]["shortfall"], (t, n_out[t], rows[t])
            assert rows[t]["nodes_out"] == n_out[t]
        else:  # untouched: the same rows, in the same order, trees unchanged
            assert t not in rows
            a = np.flatnonzero(before.tenant_codes_np == before.tenant_table.index(t))
            o = np.flatnonzero(out.tenant_codes_np == out.tenant_table.index(t))
            assert [before.ids[i] for i in a] == [out.ids[i] for i in o]
            assert torch.equal(before.embeddings[torch.as_tensor(a)], out.embeddings[torch.as_tensor(o)])
            if before.event_trees is not None:
                assert np.array_equal(before.event_trees.tree[a], out.event_trees.tree[o])
    assert all(m.tenant in rows for m in res.merges)
    check_event_trees(out, list(rows))


def check_event_trees(store: MemoryStore, tenants) -> None:
    """Every row of ``tenants`` is in a tree of its tenant, and each tree's centre original
    sits in one of that tree's rows."""
    f = store.event_trees
    assert f is not None
    where = {x: j for j, s in enumerate(store.sources) for x in s}
    for t in tenants:
        s = f.tenants[t]
        rows = np.flatnonzero(store.tenant_codes_np == store.tenant_table.index(t))
        tr = f.tree[rows]
        assert (tr >= 0).all() and (tr < s.n_trees).all()
        assert set(tr.tolist()) == set(range(s.n_trees)), "no tree may end empty"
        for k, c in enumerate(s.centres):
            assert c in where and where[c] in set(rows.tolist()) and f.tree[where[c]] == k


def same_store(a: MemoryStore, b: MemoryStore) -> bool:
    return (list(a.ids) == list(b.ids) and list(a.texts) == list(b.texts) and list(a.sources) == list(b.sources)
            and torch.equal(a.embeddings.cpu(), b.embeddings.cpu()) and list(a.tenants) == list(b.tenants)
            and torch.equal(a.timestamps.cpu(), b.timestamps.cpu())
            and np.array_equal(a.event_trees.tree,
                               b.event_trees.tree) and a.event_trees.tenants == b.event_trees.tenants)
