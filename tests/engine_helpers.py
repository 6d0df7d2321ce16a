"""Shared helpers of the engine tests (tests/test_engine*.py): store builders, the invariant
checks every compression must pass, fixtures and a merger that records its calls."""
from __future__ import annotations

import math
from collections import Counter, defaultdict

import numpy as np
import pytest
import torch
from paper import paper_config, paper_merge

from memforest_gpu.config import CompressConfig, MergeConfig
from memforest_gpu.engine import CompressResult, compress, merged_id
from memforest_gpu.engine.partition import partition_nodes
from memforest_gpu.engine.quotas import removal_target
from memforest_gpu.mergers.base import MergePair
from memforest_gpu.store.memory_store import MemoryStore
from memforest_gpu.store.synthetic import synthetic_store

CPU = "cpu"
DAY = 86400.0
NAMES = ["bob", "alice", "carol", "dave", "erin", "frank", "gina", "hank"]



# --------------------------------------------------------------------------- helpers
def build_store(sizes, *, dim=32, seed=0, shuffle=True) -> MemoryStore:
    """One synthetic tenant per size (tenants named from NAMES), rows shuffled so that
    tenants are interleaved and row order is not time order."""
    ids, texts, ts, ten, embs = [], [], [], [], []
    for j, n in enumerate(sizes):
        s = synthetic_store(n, dim=dim, seed=seed * 101 + j)
        ids += [f"{NAMES[j]}-{i}" for i in s.ids]
        texts += s.texts
        ts += s.timestamps.tolist()
        ten += [NAMES[j]] * n
        embs.append(s.embeddings)
    st = MemoryStore.from_columns(ids=ids, texts=texts, timestamps=ts, embeddings=torch.cat(embs), tenants=ten)
    if shuffle:
        perm = np.random.default_rng(seed).permutation(len(st)).tolist()
        st = st.take(perm)
    return st


def cfg_of(ratio=0.5, schedule="sequential", **merge_kw) -> CompressConfig:
    """The paper's configuration (mean embeddings, no time or size terms) at ``ratio``."""
    return paper_config(merge=paper_merge(ratio=ratio, schedule=schedule, **merge_kw))


def run(store, config=None, **kw) -> CompressResult:
    return compress(store, config, device=CPU, **kw)


def check_invariants(store: MemoryStore, res: CompressResult, ratio: float, *, capped: bool = False):
    """``store`` may itself be compressed: its nodes' sources are the originals."""
    out, rep = res.store, res.report
    owner = {x: j for j, s in enumerate(store.sources) for x in s}  # original id -> input row
    in_ts = store.timestamps.tolist()
    names = store.tenant_names()
    n_in = Counter(store.tenants)
    n_out = Counter(out.tenants)

    # ids unique, content-addressed for merged nodes, untouched nodes unchanged
    assert len(set(out.ids)) == len(out.ids)
    rows_of = []
    for j, (i, src, meta) in enumerate(zip(out.ids, out.sources, out.metadata)):
        rows = sorted({owner[x] for x in src})
        rows_of.append(rows)
        if len(rows) == 1:
            (r,) = rows
            assert i == store.ids[r] and out.texts[j] == store.texts[r] and src == store.sources[r]
            assert torch.equal(out.embeddings[j], store.embeddings[r])
            assert meta == store.metadata[r]
        else:
            assert i == merged_id(src)
            assert isinstance(meta.get("merged_from"), list) and len(meta["merged_from"]) == 2
        assert out.texts[j].strip()

    # every original in exactly one output node, never across tenants
    seen = Counter(x for s in out.sources for x in s)
    assert set(seen) == set(owner)
    assert all(c == 1 for c in seen.values())
    for t, rows, ts in zip(out.tenants, rows_of, out.timestamps.tolist()):
        assert {store.tenants[r] for r in rows} == {t}
        assert ts == max(in_ts[r] for r in rows)

    # output order: by earliest input row
    firsts = [rows[0] for rows in rows_of]
    assert firsts == sorted(firsts)

    # embeddings stay unit length
    torch.testing.assert_close(out.embeddings.norm(dim=1), torch.ones(len(out)), atol=1e-5, rtol=0)

    # per-tenant counts and report rows
    assert [r["tenant"] for r in rep.tenants] == names
    for row in rep.tenants:
        t = row["tenant"]
        N = n_in[t]
        req = removal_target(N, ratio)
        assert req == math.floor(ratio * N + 0.5)
        assert row["nodes_in"] == N and row["nodes_out"] == n_out[t]
        assert row["requested"] == req
        assert row["removed"] == N - n_out[t]
        assert 0 <= row["shortfall"] <= req
        assert n_out[t] == N - req + row["shortfall"]
        if not capped:
            # without a token cap a tenant falls short only when every tree is down to one node
            reachable = N - row["trees"]
            assert row["shortfall"] == max(0, req - reachable), row
            if row["shortfall"] > 0:
                assert n_out[t] == row["trees"]
    assert sum(r["trees"] for r in rep.tenants) == rep.trees
    assert rep.nodes_in == len(store) and rep.nodes_out == len(out)
    assert rep.merges == rep.nodes_in - rep.nodes_out == len(res.merges)
    assert rep.shortfall == sum(r["shortfall"] for r in rep.tenants)
    assert rep.ratio_reached == pytest.approx(1 - len(out) / len(store))
    if rep.merges:
        assert rep.rounds >= 1
        assert [m.round for m in res.merges] == sorted(m.round for m in res.merges)
        assert res.merges[-1].round == rep.rounds
        assert {m.round for m in res.merges} == set(range(1, rep.rounds + 1))

    # the merges log replays to the output
    sources = {i: list(s) for i, s in zip(store.ids, store.sources)}
    tenant = dict(zip(store.ids, store.tenants))
    live = set(store.ids)
    for m in res.merges:
        assert m.a in live and m.b in live and m.a != m.b
        src = sources[m.a] + sources[m.b]
        assert m.into == merged_id(src)
        assert m.tenant == tenant[m.a] == tenant[m.b]
        live -= {m.a, m.b}
        live.add(m.into)
        sources[m.into] = src
        tenant[m.into] = m.tenant
    assert live == set(out.ids)
    for i, s in zip(out.ids, out.sources):
        assert sorted(s) == sorted(sources[i])
    # a round never uses a node twice
    per_round = defaultdict(list)
    for m in res.merges:
        per_round[m.round] += [m.a, m.b]
    for r, used in per_round.items():
        assert len(used) == len(set(used)), r


def tree_of_originals(store: MemoryStore, cfg: CompressConfig) -> dict[str, int]:
    names, codes = store.tenant_index()
    p = partition_nodes(store.embeddings, store.timestamps, codes, names, cfg.partition)
    return {i: int(t) for i, t in zip(store.ids, p.tree.tolist())}


def same_output(a: MemoryStore, b: MemoryStore) -> bool:
    return (a.ids == b.ids and a.texts == b.texts and a.sources == b.sources and a.tenants == b.tenants
            and torch.equal(a.embeddings, b.embeddings) and torch.equal(a.timestamps, b.timestamps))


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """These tensors are tiny: one intra-op thread is faster, and immune to a busy machine
    (two OpenMP threads on a loaded 2-core box made this file ~10x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


SIZES = [1400, 800, 450, 340, 3, 2, 1]  # ~3,000 nodes, 7 tenants, tiny ones included


@pytest.fixture(scope="module")
def big_store():
    return build_store(SIZES, dim=32, seed=0)


@pytest.fixture(scope="module")
def small_store():
    return build_store([260, 150, 90, 3, 2, 1], dim=16, seed=1)



class RecordingMerger:
    name = "recording"

    def __init__(self, fn=None):
        self.calls: list[list[MergePair]] = []
        self.fn = fn

    def merge(self, pairs):
        pairs = list(pairs)
        self.calls.append(pairs)
        if self.fn is not None:
            return self.fn(pairs)
        return [f"{p.older.text} + {p.newer.text}" for p in pairs]


def _round_sizes(res):
    c = Counter(m.round for m in res.merges)
    return [c[r] for r in range(1, res.report.rounds + 1)]


def compress_counting_reads(store, cfg, merger):
    """``compress`` on the CPU under :func:`count_host_reads`: (result, the counter, the reads
    of each round, in order)."""
    from host_reads import count_host_reads

    from memforest_gpu.engine import compress

    per_round = []
    with count_host_reads() as reads:
        last = [0]

        def on_round(_k, _merges):
            per_round.append(reads.total - last[0])
            last[0] = reads.total

        res = compress(store, cfg, merger=merger, device="cpu", on_round=on_round)
    return res, reads, per_round
