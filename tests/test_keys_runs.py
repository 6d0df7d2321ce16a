"""Keys through every run that makes or moves merged nodes: compaction (in memory and in place
on a file), the distributed runner, a budgeted file run, the evaluation's baselines and the
M3-Agent adapter."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from compact_helpers import arrivals, check_compaction, origin_tenants, store_of
from m3_helpers import m3_agent
from paper import paper_config, paper_merge, paper_partition
from test_keys import check_keys

from memforest_gpu import compress
from memforest_gpu.adapters.m3agent import compress_video_graph, load_video_graph, save_video_graph
from memforest_gpu.api import compact_file, compress_file
from memforest_gpu.config import CompactConfig, CompressConfig, MergeConfig, PartitionConfig
from memforest_gpu.distributed import compress_distributed
from memforest_gpu.engine.compaction import compact
from memforest_gpu.evaluation.methods import compress_with, parse_method
from memforest_gpu.store.io import read_store, write_store
from memforest_gpu.store.splice import append
from memforest_gpu.store.synthetic import synthetic_store

KEYED = paper_config(partition=paper_partition(alpha=0.05),
                       merge=paper_merge(ratio=0.5, schedule="matching", keys=2, text_weight=0.5))


def originals_of(stores):
    """One store holding every original ever seen (the keys' vectors come from these)."""
    recs = [r for s in stores for r in s.records() if len(r["sources"]) == 1]
    return store_of([dict(r, sources=None) for r in {r["id"]: r for r in recs}.values()])


def keys_hold_sources(out, max_keys):
    src = out.keys.sources.to_pylist()
    for i, node_src in enumerate(out.sources):
        rows = range(int(out.keys.offsets[i]), int(out.keys.offsets[i + 1]))
        if len(node_src) > 1:
            assert 1 <= len(rows) <= max_keys and sorted(s for r in rows for s in src[r]) == sorted(node_src), i
        else:
            assert len(rows) == 0, i


def test_compaction_keeps_correct_keys():
    budget = CompactConfig(max_nodes={"a": 40, "b": 60}, low_water=0.8)
    recs = arrivals(0, 70, ["a", "b"])
    owner = origin_tenants(recs)
    store = store_of(recs)
    seen = [store]
    for step in range(3):
        res = compact(store, budget, KEYED, device="cpu")
        check_compaction(store, res, budget, owner)
        keys_hold_sources(res.store, 2)
        new = arrivals(step + 1, 12, ["a", "b"])
        owner.update(origin_tenants(new))
        store = append(res.store, store_of(new))
        seen.append(store_of(new))
    # a node merged once (two originals) has their own vectors as keys, bit for bit
    orig = originals_of(seen)
    row = {i: j for j, i in enumerate(orig.ids)}
    out = res.store
    for i, s in enumerate(out.sources):
        if len(s) == 2:
            ks = range(int(out.keys.offsets[i]), int(out.keys.offsets[i + 1]))
            got = sorted(tuple(out.keys.vectors[r].tolist()) for r in ks)
            assert got == sorted(tuple(orig.embeddings[row[x]].tolist()) for x in s)


def test_compact_file_writes_the_keys(tmp_path):
    p = tmp_path / "s.parquet"
    write_store(store_of(arrivals(0, 50, ["a", "b"])), p)
    compact_file(p, CompactConfig(max_nodes=30), KEYED, embedder="none")
    back = read_store(p)
    assert back.keys is not None and back.keys.rule == {"text_weight": 0.5, "max_keys": 2}
    keys_hold_sources(back, 2)
    compact_file(p, CompactConfig(max_nodes={"a": 20}), KEYED, embedder="none")  # a keyed file passes through
    again = read_store(p)
    keys_hold_sources(again, 2)
    b_rows = [i for i, t in enumerate(again.tenants) if t == "b"]  # tenant b untouched: its keys as they were
    b_before = [i for i, t in enumerate(back.tenants) if t == "b"]
    assert np.array_equal(again.keys.counts[b_rows], back.keys.counts[b_before])
    # another rule for the new merges would leave the store's rule wrong for them: refused, nothing written
    before = p.read_bytes()
    for keys, w in ((0, 1.0), (3, 0.5), (2, 0.9)):
        other = dataclasses.replace(KEYED, merge=dataclasses.replace(KEYED.merge, keys=keys, text_weight=w))
        with pytest.raises(ValueError, match=r"must be the store's rule \(keys 2, text_weight 0.5\)"):
            compact_file(p, CompactConfig(max_nodes={"b": 20}), other, embedder="none")
        assert p.read_bytes() == before


def test_distributed_runner_gathers_the_keys():
    st = synthetic_store(240, tenants=4, dim=16, seed=2, big_tenant_share=0.5)
    res = compress_distributed(st, KEYED, split_above=50)  # one tenant split over trees, one rank
    ref = compress(st, KEYED)
    assert list(res.store.ids) == list(ref.store.ids)
    assert np.array_equal(res.store.keys.offsets, ref.store.keys.offsets)
    assert torch.equal(res.store.keys.vectors, ref.store.keys.vectors)
    assert res.store.keys.sources.to_pylist() == ref.store.keys.sources.to_pylist()


@pytest.mark.parametrize("ext", ["parquet", "jsonl"])
def test_a_budgeted_file_run_writes_the_same_keys(tmp_path, ext):
    st = synthetic_store(300, tenants=5, dim=16, seed=4)
    src = tmp_path / f"in.{ext}"
    write_store(st, src)
    compress_file(src, tmp_path / f"mem.{ext}", KEYED, embedder="none")
    compress_file(src, tmp_path / f"bud.{ext}", KEYED, embedder="none", memory_budget=60_000)
    a, b = read_store(tmp_path / f"mem.{ext}"), read_store(tmp_path / f"bud.{ext}")
    assert list(a.ids) == list(b.ids) and a.keys.rule == b.keys.rule
    assert np.array_equal(a.keys.offsets, b.keys.offsets) and torch.equal(a.keys.vectors, b.keys.vectors)
    check_keys(st, b, 2)


@pytest.mark.parametrize("method", ["tome", "random_merge", "random_prune"])
def test_baselines_get_the_same_rule(method):
    st = synthetic_store(200, tenants=3, dim=16, seed=6)
    res = compress_with(parse_method(method), st, KEYED)
    assert res.store.keys is not None and res.store.keys.text_weight == 0.5
    keys_hold_sources(res.store, 2)
    off = compress_with(parse_method(method), st, dataclasses.replace(
        KEYED, merge=dataclasses.replace(KEYED.merge, keys=0)))
    assert off.store.keys is None


def test_m3_agent_holds_text_and_keys_found_by_its_max(tmp_path):
    """Merged nodes hold [text vector, keys...] with key_sources; every text node the same
    count (padded, here to a bound of 3 given by the user: the default bound follows the ratio,
    test_m3agent_use.py); M3-Agent's own search_text_nodes runs on it and finds a merged node by
    a source's own vector; compressing again keeps each source in one key."""
    from test_m3agent import build_video

    with m3_agent() as ns:
        g, _, _ = build_video(ns.videograph)
        src = tmp_path / "v.pkl"
        save_video_graph(g, src)
        cfg = paper_config(merge=paper_merge(ratio=0.5, keys=2, text_weight=0.5))
        res = compress_video_graph(load_video_graph(src), cfg, vectors=3)
        save_video_graph(res.graph, tmp_path / "out.pkl")
        import pickle

        out = pickle.load(open(tmp_path / "out.pkl", "rb"))
        text = [n for n in out.nodes.values() if n.type in ("episodic", "semantic")]
        assert len({len(n.embeddings) for n in text}) == 1 and len(text[0].embeddings) == 3
        merged = [n for n in text if len(n.metadata.get("merged_from", [])) > 1]
        assert merged and all(sorted(x for k in n.metadata["key_sources"] for x in k) ==
                              sorted(n.metadata["merged_from"]) for n in merged)
        m = merged[0]
        first = m.metadata["key_sources"][0][0]
        q = g.nodes[first].embeddings[0]
        hits = dict(out.search_text_nodes([q], mode="max"))
        assert hits[m.id] == pytest.approx(max(float(np.dot(q, e) / np.linalg.norm(q) / np.linalg.norm(e))
                                                for e in m.embeddings))
        assert hits[m.id] > float(np.dot(q, m.embeddings[0]) / np.linalg.norm(q) / np.linalg.norm(m.embeddings[0]))
        again = compress_video_graph(load_video_graph(tmp_path / "out.pkl"), cfg)
        for n in again.graph.nodes.values():
            if len(n.metadata.get("merged_from", [])) > 1:
                assert sorted(x for k in n.metadata["key_sources"] for x in k) == sorted(n.metadata["merged_from"])


def test_mem0_keeps_one_vector_per_memory(monkeypatch):
    """A Mem0 memory holds one vector: compress_mem0 and compact_mem0 run with one blended vector
    per memory (keys 1), whatever the config's keys."""
    from memforest_gpu.adapters.mem0 import compaction as mem0_compact
    from memforest_gpu.adapters.mem0 import inplace as mem0

    one = mem0.single_vector(KEYED)
    assert one.merge.keys == 1 and one.merge.text_weight == KEYED.merge.text_weight  # one blended vector
    assert mem0.single_vector(CompressConfig.preset("paper")).merge.keys == 0
    assert mem0.single_vector(None) is None
    seen = []

    class Stop(Exception):
        pass

    def fake(store, *a, **k):
        seen.append(next(x for x in a if isinstance(x, CompressConfig)).merge.keys)
        raise Stop

    st = synthetic_store(20, tenants=1, dim=8, seed=1)

    class Emb:
        name, dim = "e", 8

    class P:
        id, payload, vector = "p", {"user_id": "u"}, np.zeros(8, dtype=np.float32)

    monkeypatch.setattr(mem0, "check_dimension", lambda *a, **k: None)
    monkeypatch.setattr(mem0, "read_points", lambda memory, filters: [P])
    monkeypatch.setattr(mem0, "split_eligible", lambda points, scope, dry_run, clock: ([P], None))
    monkeypatch.setattr(mem0, "Mem0Embedder", lambda memory, device=None: Emb())
    monkeypatch.setattr(mem0, "store_of_points", lambda todo, name: st)
    monkeypatch.setattr(mem0, "compress", fake)
    with pytest.raises(Stop):
        mem0.compress_mem0(None, mem0.Scope(user_id="u"), KEYED)
    monkeypatch.setattr(mem0_compact, "check_dimension", lambda *a, **k: None)
    monkeypatch.setattr(mem0_compact, "read_points", lambda memory, filters: [P] * 20)
    monkeypatch.setattr(mem0_compact, "split_eligible", lambda points, scope, dry_run, clock: (points, None))
    monkeypatch.setattr(mem0_compact, "read_state", lambda state: ({}, {}))
    monkeypatch.setattr(mem0_compact, "Mem0Embedder", lambda memory, device=None: Emb())
    monkeypatch.setattr(mem0_compact, "store_of_points", lambda todo, name: st)
    monkeypatch.setattr(mem0_compact, "compact", fake)
    with pytest.raises(Stop):
        mem0_compact.compact_mem0(None, CompactConfig(max_nodes=5), KEYED)
    assert seen == [1, 1]  # one blended vector per memory, never every source's key
