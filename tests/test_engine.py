"""Tests for memforest_gpu.engine.compress: the invariants of progressive merging.

Small synthetic stores (dim 16-64) on the CPU, so the whole file runs in well under a
minute. Invariants checked on every compression (``check_invariants``):

- each tenant loses exactly round(ratio * N_t) nodes, unless the report's per-tenant
  ``shortfall`` says it could not (and then only when it really could not);
- every original id ends in exactly one output node's ``sources``, never across tenants;
- timestamps are the max of the sources', ids unique and content-addressed;
- report fields agree with the output and the merges log.
"""
from __future__ import annotations

import hashlib
import math
from collections import Counter, defaultdict

import numpy as np
import pytest
import torch
from engine_helpers import (  # noqa: F401 (pytest fixtures: used by name)
    CPU,
    DAY,
    NAMES,
    SIZES,
    _one_thread,
    _round_sizes,
    big_store,
    build_store,
    cfg_of,
    check_invariants,
    run,
    same_output,  # noqa: F401
    small_store,
    tree_of_originals,
)
from kernel_helpers import kruskal_ref

from memforest_gpu.config import CompressConfig, MergeConfig, PartitionConfig
from memforest_gpu.engine import DATE_TAG_TOKENS, compress
from memforest_gpu.engine.quotas import removal_target
from memforest_gpu.mergers.embedders import count_words
from memforest_gpu.store.memory_store import MemoryStore


# --------------------------------------------------------------------------- invariants
@pytest.mark.parametrize("schedule", ["sequential", "matching"])
@pytest.mark.parametrize("ratio", [0.3, 0.5, 0.7])
def test_invariants_many_tenants(big_store, ratio, schedule, device):
    """On every available device (CPU always, CUDA when present); the store moves there."""
    assert len(big_store) == sum(SIZES)
    store = big_store.to(device)
    res = compress(store, cfg_of(ratio, schedule), device=device)
    check_invariants(store.to("cpu"), _to_cpu(res), ratio)
    rows = {r["tenant"]: r for r in res.report.tenants}
    # big tenants always reach the target exactly
    for t in NAMES[:4]:
        assert rows[t]["shortfall"] == 0
        assert rows[t]["nodes_out"] == rows[t]["nodes_in"] - removal_target(rows[t]["nodes_in"], ratio)
    # a one-node tenant cannot lose anything
    assert rows["gina"]["nodes_out"] == 1
    assert rows["gina"]["shortfall"] == removal_target(1, ratio)
    assert res.report.schedule == schedule
    assert res.report.merger == "extractive"
    assert res.report.embedder == "mean-of-inputs"
    assert res.report.max_node_tokens is None
    assert res.report.fallbacks == 0


def test_input_store_not_modified(small_store):
    before = (list(small_store.ids), list(small_store.texts), small_store.embeddings.clone(),
              small_store.timestamps.clone(), [list(s) for s in small_store.sources],
              [dict(m) for m in small_store.metadata])
    run(small_store, cfg_of(0.6))
    assert small_store.ids == before[0] and small_store.texts == before[1]
    assert torch.equal(small_store.embeddings, before[2]) and torch.equal(small_store.timestamps, before[3])
    assert small_store.sources == before[4] and small_store.metadata == before[5]


def test_compress_a_compressed_store(small_store):
    """Sources of already merged nodes are carried along, metadata is merged."""
    first = run(small_store, cfg_of(0.4))
    second = run(first.store, cfg_of(0.5))
    check_invariants(first.store, second, 0.5)
    seen = Counter(x for s in second.store.sources for x in s)
    assert set(seen) == set(small_store.ids) and set(seen.values()) == {1}


def test_defaults_and_bad_arguments(small_store):
    res = compress(small_store.select_tenant("bob"), device=CPU)  # config=None: the method's defaults
    check_invariants(small_store.select_tenant("bob"), res, 0.5)
    with pytest.raises(ValueError, match="CompressConfig"):
        compress(small_store, MergeConfig(ratio=0.5), device=CPU)
    with pytest.raises(ValueError, match="MemoryStore"):
        compress(small_store.records(), cfg_of(0.5), device=CPU)


# --------------------------------------------------------------------------- determinism
@pytest.mark.parametrize("schedule", ["sequential", "matching"])
def test_deterministic(small_store, schedule, device):
    """Two runs on the same device give the same output (CPU always, CUDA when present)."""
    cfg = cfg_of(0.5, schedule)
    store = small_store.to(device)
    a, b = compress(store, cfg, device=device), compress(store, cfg, device=device)
    assert same_output(a.store, b.store)
    assert a.store.metadata == b.store.metadata
    assert a.merges == b.merges
    assert a.report.rounds == b.report.rounds


def test_partition_seed_changes_output(small_store):
    base = run(small_store, cfg_of(0.5))
    outs = []
    for seed in (1, 2, 3):
        cfg = CompressConfig(partition=PartitionConfig(seed=seed), merge=MergeConfig(ratio=0.5))
        res = run(small_store, cfg)
        check_invariants(small_store, res, 0.5)
        outs.append(sorted(map(sorted, res.store.sources)))
    base_groups = sorted(map(sorted, base.store.sources))
    assert any(o != base_groups for o in outs)


# --------------------------------------------------------------------------- tenant independence
@pytest.mark.parametrize("schedule", ["sequential", "matching"])
def test_tenant_independence(schedule):
    # tenants of similar size share padded batches in partitioning and merging
    st = build_store([400, 300, 260, 3, 2, 1], dim=32, seed=2)
    cfg = cfg_of(0.5, schedule)
    full = run(st, cfg)
    for t in st.tenant_names():
        alone = run(st.select_tenant(t), cfg)
        part = full.store.select_tenant(t)
        assert alone.store.ids == part.ids, t
        assert alone.store.texts == part.texts, t
        assert alone.store.sources == part.sources, t
        assert torch.equal(alone.store.embeddings, part.embeddings), t
        row = next(r for r in full.report.tenants if r["tenant"] == t)
        assert alone.report.tenants[0] == row


def test_tenant_names_do_not_matter_for_other_tenants():
    """Renaming one tenant never changes another tenant's result."""
    st = build_store([200, 180], dim=16, seed=3, shuffle=False)
    renamed = MemoryStore.from_columns(ids=st.ids, texts=st.texts, timestamps=st.timestamps,
                                       embeddings=st.embeddings,
                                       tenants=["zed" if t == "bob" else t for t in st.tenants])
    a = run(st, cfg_of(0.5)).store.select_tenant("alice")
    b = run(renamed, cfg_of(0.5)).store.select_tenant("alice")
    assert same_output(a, b)


# --------------------------------------------------------------------------- schedules
def test_sequential_rounds(small_store):
    cfg = cfg_of(0.5, "sequential")
    seq = run(small_store, cfg)
    mat = run(small_store, cfg_of(0.5, "matching"))
    check_invariants(small_store, seq, 0.5)
    check_invariants(small_store, mat, 0.5)
    rows = seq.report.tenants
    lower = max(math.ceil((r["nodes_in"] - r["nodes_out"]) / r["trees"]) for r in rows)
    assert seq.report.rounds >= lower
    assert mat.report.rounds < seq.report.rounds

    # exact: one merge per tree per round, rounds == the largest number of merges any tree makes
    tree = tree_of_originals(small_store, cfg)
    sources = {i: [i] for i in small_store.ids}
    per_tree = Counter()
    per_round_tree = Counter()
    for m in seq.merges:
        src = sources[m.a] + sources[m.b]
        sources[m.into] = src
        trees = {tree[x] for x in src}
        assert len(trees) == 1, "a merge crossed two EventTrees"
        (t,) = trees
        per_tree[t] += 1
        per_round_tree[(m.round, t)] += 1
    assert max(per_round_tree.values()) == 1
    assert seq.report.rounds == max(per_tree.values())
    assert seq.report.trees == len(set(tree.values()))


def test_matching_merges_stay_inside_trees(small_store):
    cfg = cfg_of(0.7, "matching")
    res = run(small_store, cfg)
    tree = tree_of_originals(small_store, cfg)
    sources = {i: [i] for i in small_store.ids}
    for m in res.merges:
        src = sources[m.a] + sources[m.b]
        sources[m.into] = src
        assert len({tree[x] for x in src}) == 1


# --------------------------------------------------------------------------- token cap
def capped_store(seed=0, dim=24):
    """Short texts (2-7 words + punctuation), a few long ones, spread over days."""
    rng = np.random.default_rng(seed)
    words = "red blue green cat dog tea jazz hike paris book bike cake".split()
    ids, texts, ts, ten = [], [], [], []
    for t, n in (("ann", 120), ("ben", 60), ("cy", 2)):
        for i in range(n):
            k = 60 if i % 25 == 7 else int(rng.integers(2, 8))  # some originals already over the cap
            texts.append(" ".join(rng.choice(words, k)) + f" #{t}{i}.")
            ids.append(f"{t}{i}")
            ts.append(1.68e9 + DAY * float(rng.integers(0, 10)) + 60.0 * i)
            ten.append(t)
    emb = rng.standard_normal((len(ids), dim)).astype(np.float32)
    return MemoryStore.from_columns(ids=ids, texts=texts, timestamps=ts, embeddings=emb, tenants=ten)


@pytest.mark.parametrize("schedule", ["sequential", "matching"])
def test_token_cap(schedule):
    cap = 40
    st = capped_store()
    # the "strict" cap policy: pairs over the cap are not merged ("condense": tests/test_cap_policy.py)
    cfg = CompressConfig(merge=MergeConfig(ratio=0.7, schedule=schedule, max_node_tokens=cap, cap_policy="strict"))
    res = run(st, cfg)  # embedder=None: tokens counted with count_words
    check_invariants(st, res, 0.7, capped=True)
    assert res.report.max_node_tokens == cap
    orig_tokens = dict(zip(st.ids, count_words(st.texts)))
    over_orig = {i for i, c in orig_tokens.items() if c > cap}
    assert over_orig, "the store must hold originals over the cap"
    for i, text, src in zip(res.store.ids, res.store.texts, res.store.sources):
        n = count_words([text])[0]
        if n > cap:
            assert len(src) == 1 and src[0] in over_orig, (i, n, text)
    # an original over the cap can never be merged
    for x in over_orig:
        assert x in res.store.ids
    # the cap costs removals, and the report says so
    assert res.report.shortfall > 0
    rows = {r["tenant"]: r for r in res.report.tenants}
    for row in rows.values():
        assert row["nodes_out"] == row["nodes_in"] - row["requested"] + row["shortfall"]
    # a tenant falls short only when none of its trees has a spanning-tree edge under the cap
    tree = tree_of_originals(st, cfg)
    for t, row in rows.items():
        if row["shortfall"] == 0:
            continue
        groups = defaultdict(list)
        for j, (tt, src) in enumerate(zip(res.store.tenants, res.store.sources)):
            if tt == t:
                groups[tree[src[0]]].append(j)
        for g in groups.values():
            if len(g) < 2:
                continue
            E = res.store.embeddings[g].numpy().astype(np.float64)
            tok = count_words([res.store.texts[j] for j in g])
            day = [math.floor(res.store.timestamps[j].item() / DAY) for j in g]
            for a, b in kruskal_ref(E @ E.T, np.ones(len(E), dtype=bool)):
                est = tok[a] + tok[b] + DATE_TAG_TOKENS * (day[a] != day[b])
                assert est > cap, (t, res.store.ids[g[a]], res.store.ids[g[b]], est)


def test_token_cap_with_verbose_merger():
    """A merger whose texts exceed the cap is replaced by the extractive merger for those pairs."""
    cap = 40

    class Verbose:
        name = "verbose"

        def merge(self, pairs):
            return [(p.older.text + " " + p.newer.text + " ") * 4 for p in pairs]

    st = capped_store(seed=1)
    res = run(st, CompressConfig(merge=MergeConfig(ratio=0.5, max_node_tokens=cap, cap_policy="strict")),
              merger=Verbose())
    check_invariants(st, res, 0.5, capped=True)
    assert res.report.fallbacks > 0
    orig_tokens = dict(zip(st.ids, count_words(st.texts)))
    for text, src in zip(res.store.texts, res.store.sources):
        if count_words([text])[0] > cap:
            assert len(src) == 1 and orig_tokens[src[0]] > cap


# --------------------------------------------------------------------------- embeddings
def test_mean_embedding_fallback(small_store):
    res = run(small_store, cfg_of(0.5))
    emb = {i: small_store.embeddings[j] for j, i in enumerate(small_store.ids)}
    n_pairs = 0
    for m in res.merges:
        expect = torch.nn.functional.normalize(emb[m.a] + emb[m.b], dim=0)
        emb[m.into] = expect
    for j, (i, src) in enumerate(zip(res.store.ids, res.store.sources)):
        if len(src) > 1:
            torch.testing.assert_close(res.store.embeddings[j], emb[i], atol=1e-6, rtol=0)
        if len(src) == 2:  # a merge of two originals
            a, b = (small_store.ids.index(x) for x in src)
            e = torch.nn.functional.normalize(small_store.embeddings[a] + small_store.embeddings[b], dim=0)
            torch.testing.assert_close(res.store.embeddings[j], e, atol=1e-6, rtol=0)
            n_pairs += 1
    assert n_pairs > 0


class FakeEmbedder:
    """Deterministic hash embeddings; records every call."""

    def __init__(self, dim, max_tokens=None, name="fake-embedder"):
        self.name = name
        self.dim = dim
        self.max_tokens = max_tokens
        self.calls: list[list[str]] = []
        self.count_calls: list[list[str]] = []

    def vector(self, text):
        seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
        v = torch.from_numpy(np.random.default_rng(seed).standard_normal(self.dim).astype(np.float32))
        return v / v.norm()

    def embed(self, texts):
        texts = list(texts)
        self.calls.append(texts)
        return torch.stack([self.vector(t) for t in texts]) if texts else torch.empty(0, self.dim)

    def count_tokens(self, texts):
        self.count_calls.append(list(texts))
        return count_words(texts)


@pytest.mark.parametrize("schedule", ["sequential", "matching"])
def test_embedder_called_once_per_round(small_store, schedule):
    fe = FakeEmbedder(small_store.dim)
    res = run(small_store, cfg_of(0.5, schedule), embedder=fe)
    check_invariants(small_store, res, 0.5)
    assert len(fe.calls) == res.report.rounds
    assert sum(map(len, fe.calls)) == res.report.merges
    assert fe.count_calls == []  # no cap: tokens never counted
    assert res.report.embedder == "fake-embedder" and res.report.max_node_tokens is None
    assert [len(c) for c in fe.calls] == _round_sizes(res)
    # merged nodes carry the embedder's vector of their own text
    embedded = {t for c in fe.calls for t in c}
    for j, (text, src) in enumerate(zip(res.store.texts, res.store.sources)):
        if len(src) > 1:
            assert text in embedded
            assert torch.equal(res.store.embeddings[j], fe.vector(text))


def test_embedder_max_tokens_is_the_default_cap():
    st = capped_store(seed=2, dim=16)
    fe = FakeEmbedder(st.dim, max_tokens=30)
    res = run(st, cfg_of(0.5, cap_policy="strict"), embedder=fe)
    check_invariants(st, res, 0.5, capped=True)
    assert res.report.max_node_tokens == 30
    assert fe.count_calls, "the embedder's own token counter must be used"
    assert len(fe.calls) == res.report.rounds
    # an explicit max_node_tokens wins over the embedder's limit
    fe2 = FakeEmbedder(st.dim, max_tokens=30)
    res2 = run(st, cfg_of(0.5, max_node_tokens=1000), embedder=fe2)
    assert res2.report.max_node_tokens == 1000
    assert res2.report.shortfall == 0


def test_embedder_dim_mismatch(small_store):
    with pytest.raises(ValueError, match=str(small_store.dim)) as e:
        run(small_store, cfg_of(0.5), embedder=FakeEmbedder(small_store.dim + 1))
    assert str(small_store.dim + 1) in str(e.value)



# --------------------------------------------------------------------------- known bug
def _dup_store(parts):
    ids, texts, ts, ten, embs = [], [], [], [], []
    for name, e in parts:
        for i in range(len(e)):
            ids.append(f"{name}{i}")
            texts.append(f"{name} fact {i}.")
            ts.append(1.6e9 + 3600.0 * i)
            ten.append(name)
        embs.append(e)
    return MemoryStore.from_columns(ids=ids, texts=texts, timestamps=ts, embeddings=np.concatenate(embs), tenants=ten)


def test_tenant_independence_with_duplicate_embeddings():
    cfg = CompressConfig(partition=PartitionConfig(alpha=0.001), merge=MergeConfig(ratio=0.5))  # 1 tree/tenant
    diffs = []
    for D, na, nb, seed in ((16, 20, 30, 1), (16, 20, 30, 2), (64, 40, 60, 1), (64, 40, 60, 2)):
        rng = np.random.default_rng(seed)
        base = rng.standard_normal((3, D)).astype(np.float32)
        a = base[rng.integers(0, 3, na)]  # tenant "a": only 3 distinct vectors (repeated facts)
        b = rng.standard_normal((nb, D)).astype(np.float32)  # tenant "b": anything
        alone = run(_dup_store([("a", a)]), cfg).store
        both = run(_dup_store([("a", a), ("b", b)]), cfg).store.select_tenant("a")
        if alone.ids != both.ids or alone.sources != both.sources:
            diffs.append((D, na, nb, seed))
    assert diffs == []


def test_row_sims_matches_per_pair_einsum_with_repeated_rows_and_chunks(monkeypatch):
    import memforest_gpu.engine.node_vectors as vectors_mod
    from memforest_gpu.engine.node_vectors import NodeVectors, row_sims

    g = torch.Generator().manual_seed(3)
    vec = NodeVectors(torch.randn(60, 5, generator=g))
    slot = torch.randperm(63, generator=g)[:63].view(7, 9) - 3  # node rows, a few empty slots (-1..-3 -> empty)
    slot = torch.where(slot < 0, -1, slot)
    X = vec.gather(slot)  # (7, 9, 5), zeros in empty slots
    r = torch.tensor([4, 0, 4, 4, 2, 0, 6])  # several pairs in one tree, trees out of order
    E = torch.randn(7, 5, generator=g)
    want = torch.einsum("pmd,pd->pm", X[r].double(), E.double()).float()
    table = NodeVectors(torch.cat([vec.gather(torch.arange(60)), E]))  # the new vectors as rows 60..66
    nodes = torch.arange(60, 67)
    for step in (1, 2, 1 << 20):  # one tree per chunk, a few, all at once
        monkeypatch.setattr(vectors_mod, "stream_rows", lambda *a, _s=step, **k: _s)
        assert torch.equal(row_sims(vec, slot, r.numpy(), E), want)
        assert torch.equal(row_sims(table, slot, r.numpy(), nodes), want)  # read from the table by row


def test_assemble_picks_originals_and_merged_rows_in_output_order():
    from memforest_gpu.engine.node_table import NodeTable
    from memforest_gpu.engine.output import assemble

    st = MemoryStore.from_columns(ids=[f"n{i}" for i in range(4)], texts=[f"t{i}" for i in range(4)],
                                  timestamps=[0.0, 1.0, 2.0, 3.0], embeddings=torch.eye(4))
    table = NodeTable(st)
    table.add(1, 3, "t1 t3")  # row 4
    table.add(0, 2, "t0 t2")  # row 5
    merged = torch.nn.functional.normalize(torch.tensor([[0.0, 1, 0, 1], [1.0, 0, 1, 0]]), dim=1)
    live = np.array([False, False, False, False, True, True])
    out = assemble(table, live, st.embeddings, merged)
    assert out.texts == ["t0 t2", "t1 t3"]  # by earliest original inside
    assert torch.equal(out.embeddings, merged[[1, 0]])
    live = np.array([True, False, True, False, True, False])
    out = assemble(table, live, st.embeddings, merged)
    assert out.ids[0] == "n0" and out.texts == ["t0", "t1 t3", "t2"]
    assert torch.equal(out.embeddings, torch.stack([st.embeddings[0], merged[0], st.embeddings[2]]))


def _to_cpu(res):
    res.store = res.store.to("cpu")
    return res


def test_dense_cosines_do_not_depend_on_the_trees_computed_together():
    """The dense graph's cosines of a bucket are computed a block of trees at a time (the
    block bounded by the trees' gathered vectors); each tree's matrix is the same bits as when
    computed alone, also across a block boundary (here 62 trees a block on the CPU, 250 trees)."""
    from memforest_gpu.engine.node_vectors import NodeVectors
    from memforest_gpu.engine.trees import _cosines

    g = torch.Generator().manual_seed(0)
    vectors = NodeVectors(torch.nn.functional.normalize(torch.randn(500, 2048, generator=g), dim=1))
    slots = torch.randint(0, 500, (250, 64), generator=g)
    slots[:, 50:] = torch.where(torch.rand(250, 14, generator=g) < 0.5, -1, slots[:, 50:])  # empty slots
    W = _cosines(vectors, slots)
    assert W.shape == (250, 64, 64) and torch.equal(W, W.transpose(1, 2))
    for i in (0, 1, 247, 248, 249):
        assert torch.equal(W[i:i + 1], _cosines(vectors, slots[i:i + 1])), i


def test_pair_means_written_in_place_into_the_vector_table():
    """Without an embedder a round's means go straight into the run's vector table (float32
    storage): pair_means returns the table's next rows, apply's append takes them without a
    copy, and they equal the normalised sums, gathered from originals and merged rows alike."""
    from types import SimpleNamespace

    from memforest_gpu.engine.apply import pair_means
    from memforest_gpu.engine.node_vectors import NodeVectors

    g = torch.Generator().manual_seed(5)
    base = torch.nn.functional.normalize(torch.randn(10, 6, generator=g), dim=1)
    vec = NodeVectors(base, capacity=2)  # room for 2: the third merge grows the table
    first = torch.nn.functional.normalize(base[0] + base[1], dim=0)
    vec.append(np.array([10]), first[None])
    batch = SimpleNamespace(vectors=vec)

    class _Plan(SimpleNamespace):
        def __len__(self):
            return len(self.node_a)

    plan = _Plan(node_a=np.array([2, 10, 4]), node_b=np.array([3, 5, 6]))
    got = pair_means(batch, plan)
    full = torch.cat([base, first[None]])
    want = torch.nn.functional.normalize(full[[2, 10, 4]] + full[[3, 5, 6]], dim=1)
    assert torch.equal(got, want)
    assert got.data_ptr() == vec.next_rows(3).data_ptr()  # the table's own rows
    stored = vec.append(np.array([11, 12, 13]), got)
    assert stored.data_ptr() == got.data_ptr()  # taken without a copy
    assert torch.equal(vec.merged(), torch.cat([first[None], want]))
    assert torch.equal(vec.gather(torch.tensor([11, 13, 10, -1])), torch.cat([want[[0, 2]], first[None],
                                                                              torch.zeros(1, 6)]))
    other = torch.randn(1, 6, generator=g)  # any other tensor is copied in
    vec.append(np.array([14]), other)
    assert torch.equal(vec.merged()[-1], other[0])
