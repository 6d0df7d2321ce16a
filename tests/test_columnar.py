"""The columnar store (issue 12): Arrow columns behind read-only views, tenant codes, batched
Parquet reads (tenant filter, preallocated vectors), the columnar node table, and the
storage dtype of the vectors the engine's trees read."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from test_io import assert_same, make_store

import memforest_gpu.store.parquet as parquet_mod
from memforest_gpu import CompressConfig, MergeConfig, compress
from memforest_gpu.engine.node_table import NodeTable
from memforest_gpu.engine.trees import build_trees
from memforest_gpu.store.io import read_store, write_store
from memforest_gpu.store.memory_store import ArrowView, MemoryStore, TenantView
from memforest_gpu.store.synthetic import synthetic_store


def err(fn, *a, **kw) -> str:
    with pytest.raises(ValueError) as e:
        fn(*a, **kw)
    return str(e.value)


# --------------------------------------------------------------------------- views
def test_views_behave_like_read_only_lists():
    s = make_store(n=5)
    assert isinstance(s.ids, ArrowView) and isinstance(s.tenants, TenantView)
    assert s.ids == [f"m{i}" for i in range(5)] and s.ids[-1] == "m4" and s.ids[np.int64(2)] == "m2"
    assert s.ids[1:3] == ["m1", "m2"] and s.ids[::2] == ["m0", "m2", "m4"] and list(s.ids) == s.ids[:]
    assert s.tenants.count("bob") == 3 and s.tenants.count("nobody") == 0 and "alice" in s.tenants
    assert s.sources[1] == ["m1", "orig1a", "orig1b"] and s.sources[0] == ["m0"]
    assert s.metadata[1] == {} and s.metadata[0]["speaker"] == "Zoë"
    with pytest.raises(IndexError):
        s.ids[5]
    with pytest.raises(TypeError):
        s.ids[0] = "x"
    got = s.metadata[0]
    got["i"] = 99  # a parsed copy: the store keeps its value
    assert s.metadata[0]["i"] == 0


def test_tenant_codes_are_stored_not_recomputed():
    s = make_store(n=5)
    names, codes = s.tenant_index()
    assert names == ["bob", "alice"] and codes is s.tenant_codes and codes.dtype == torch.int64
    assert codes.tolist() == [0, 1, 0, 1, 0] and s.tenant_table == ["bob", "alice"]
    sub = s.take([1, 0])  # the name table follows the rows' first appearance
    assert sub.tenant_names() == ["alice", "bob"] and sub.tenant_codes.tolist() == [0, 1]
    assert s.select_tenant("alice").tenant_names() == ["alice"]


def test_constructor_and_replace_accept_lists_views_and_arrow():
    s = make_store(n=4)
    a = MemoryStore(list(s.ids), list(s.texts), s.embeddings, s.timestamps, list(s.tenants), list(s.sources),
                    list(s.metadata), s.embedder)
    b = MemoryStore(s.ids, s.texts, s.embeddings, s.timestamps, s.tenants, s.sources, s.metadata, s.embedder)
    for x in (a, b, dataclasses.replace(s, embedder="other")):
        assert x.ids == s.ids and x.tenants == s.tenants and x.sources == s.sources and x.metadata == s.metadata
    assert dataclasses.replace(s, embedder="other").embedder == "other"


def test_arrow_columns_are_validated_with_the_same_messages():
    base = dict(texts=pa.array(["a", "b", "c"]), timestamps=np.array([1.0, 2.0, 3.0]), embeddings=torch.eye(3))
    assert "duplicate id 'x'" in err(MemoryStore.from_columns, ids=pa.array(["x", "y", "x"]), **base)
    assert "id must be a non-empty string" in err(MemoryStore.from_columns, ids=pa.array(["x", "", "z"]), **base)
    ids = pa.array(["x", "y", "z"])
    msg = err(MemoryStore.from_columns, ids=ids, **{**base, "texts": pa.array(["a", "  ", "c"])})
    assert "text of node 'y' must be a non-empty string" in msg
    msg = err(MemoryStore.from_columns, ids=ids, **{**base, "timestamps": np.array([1.0, np.nan, 3.0])})
    assert "timestamp of node 'y' must be finite" in msg
    msg = err(MemoryStore.from_columns, ids=ids, **{**base, "timestamps": np.array([1.0, 2e12, 3.0])})
    assert "timestamp of node 'y'" in msg and "milliseconds" in msg
    src = pa.array([["a"], ["b", "a"], None], type=pa.list_(pa.string()))
    assert "original 'a' in both 'x' and 'y'" in err(MemoryStore.from_columns, ids=ids, sources=src, **base)
    src = pa.array([["a"], [], None], type=pa.list_(pa.string()))
    assert "sources of node 'y' must be a non-empty list" in err(MemoryStore.from_columns, ids=ids, sources=src,
                                                                 **base)
    meta = pa.array(['{"k": 1}', "[1]", None])
    assert "metadata of node 'y' must be a JSON object" in err(MemoryStore.from_columns, ids=ids, metadata=meta,
                                                               **base)
    ten = pa.array(["t", None, ""])
    assert "tenant of node 'z' must be a non-empty string" in err(MemoryStore.from_columns, ids=ids, tenants=ten,
                                                                  **base)
    ok = MemoryStore.from_columns(ids=ids, tenants=pa.array(["t", None, "u"]), sources=pa.array(
        [["a"], None, ["q", "r"]], type=pa.list_(pa.string())), metadata=pa.array(['{"k":1}', None, ""]), **base)
    assert ok.tenants == ["t", "default", "u"] and ok.sources == [["a"], ["y"], ["q", "r"]]
    assert ok.metadata == [{"k": 1}, {}, {}] and ok.columns()["metadata"].to_pylist()[0] == '{"k": 1}'


# --------------------------------------------------------------------------- batched Parquet reads
@pytest.fixture
def small_batches(monkeypatch):
    monkeypatch.setattr(parquet_mod, "_BATCH_ROWS", 3)


def test_batched_read_equals_one_batch(tmp_path, monkeypatch):
    s = make_store(n=11)
    p = tmp_path / "s.parquet"
    write_store(s, p)
    whole = read_store(p)
    monkeypatch.setattr(parquet_mod, "_BATCH_ROWS", 2)
    assert_same(whole, read_store(p))
    assert torch.equal(whole.embeddings, read_store(p).embeddings)


def test_read_only_some_tenants(tmp_path, small_batches):
    s = make_store(n=11)
    p = tmp_path / "s.parquet"
    write_store(s, p)
    alice = read_store(p, tenants=["alice"])
    assert_same(s.select_tenant("alice"), alice)
    both = read_store(p, tenants="bob")
    assert both.tenant_names() == ["bob"] and len(both) == 6
    msg = err(read_store, p, tenants=["carol"])
    assert "tenant must be one of ['bob', 'alice'], got 'carol'" in msg


def test_batched_read_of_list_vectors_and_errors(tmp_path, small_batches):
    ids = [f"n{i}" for i in range(7)]
    vec = [[1.0, 0.0, 0.0]] * 7
    base = {"id": ids, "text": ["t"] * 7, "timestamp": [1.0 * i for i in range(7)]}
    p = tmp_path / "a.parquet"
    pq.write_table(pa.table({**base, "embedding": pa.array(vec, type=pa.list_(pa.float64()))}), p)
    s = read_store(p)
    assert s.embeddings.dtype == torch.float32 and s.embeddings.shape == (7, 3) and s.tenants == ["default"] * 7
    bad = vec[:5] + [[1.0, 0.0]] + vec[6:]
    pq.write_table(pa.table({**base, "embedding": pa.array(bad, type=pa.list_(pa.float64()))}), p)
    assert "node 'n0' has 3 but node 'n5' has 2" in err(read_store, p)
    miss = vec[:4] + [None] + vec[5:]
    pq.write_table(pa.table({**base, "embedding": pa.array(miss, type=pa.list_(pa.float32()))}), p)
    assert "embedding of node 'n4' is missing while other nodes have one" in err(read_store, p)
    meta = ["{}"] * 4 + ["{not json"] + ["{}"] * 2
    pq.write_table(pa.table({**base, "embedding": pa.array(vec, type=pa.list_(pa.float32())), "metadata": meta}), p)
    assert "metadata of node 'n4' is not valid JSON" in err(read_store, p)
    meta = ["{}"] * 4 + ['{ "a" :1 }'] + [""] * 2  # any JSON spacing: kept as this package writes it
    pq.write_table(pa.table({**base, "embedding": pa.array(vec, type=pa.list_(pa.float32())), "metadata": meta}), p)
    s = read_store(p)
    assert s.metadata[4] == {"a": 1} and s.columns()["metadata"].to_pylist()[4:] == ['{"a": 1}', "{}", "{}"]


# --------------------------------------------------------------------------- node table and engine
def test_node_table_batch_methods_agree_with_single_ones():
    st = synthetic_store(40, tenants=2, dim=8, seed=1)
    t = NodeTable(st)
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 40, 30), rng.integers(0, 40, 30)
    o, n = t.order_many(a, b)
    assert [(int(x), int(y)) for x, y in zip(o, n)] == [t.order(int(x), int(y)) for x, y in zip(a, b)]
    j = t.add(int(o[0]), int(n[0]), "merged text")
    assert t.merge_pairs(np.array([j, 3]), np.array([5, j])) == [t.merge_pair(j, 5), t.merge_pair(3, j)]
    assert t.texts[j] == "merged text" and t.ids[j].startswith("mf-") and len(t) == 41
    assert t.tenant[j] == st.tenants[int(o[0])] and t.ts[j] == max(t.ts[o[0]], t.ts[n[0]])


def test_merged_metadata_in_bulk_equals_the_row_by_row_rule():
    """Merged rows' metadata JSON, written at once by Arrow where nothing below a row has
    metadata, equals ``json.dumps`` of the rule (``{**older, **newer, "merged_from": [...]}``),
    with ids json must escape and metadata on some sources, over many random merge orders."""
    from memforest_gpu.store.columns import dumps_meta

    rng = np.random.default_rng(0)
    for _ in range(40):
        n = int(rng.integers(2, 40))
        ids = [f"m{i}" if rng.random() > 0.2 else f'q"{i}\\\n' for i in range(n)]
        meta = [None if rng.random() < 0.7 else {"k": int(rng.integers(3)), f"x{i}": i} for i in range(n)]
        st = MemoryStore.from_columns(ids=ids, texts=[f"t{i}" for i in range(n)], metadata=meta,
                                      timestamps=rng.integers(0, 5, n).astype(float), embeddings=torch.randn(n, 4))
        t, live = NodeTable(st), list(range(n))
        for _ in range(int(rng.integers(1, n))):
            a, b = rng.choice(len(live), 2, replace=False)
            o, w = t.order(live[a], live[b])
            live = [x for x in live if x not in (o, w)] + [t.add(o, w, "x")]
        m = np.array(sorted(x - n for x in live if x >= n), dtype=np.int64)
        got = t._merged_meta(m, [t.m_ids[j] for j in m]).to_pylist()
        assert got == [dumps_meta(t._meta(n + j), t.m_ids[j]) for j in m]
        assert all(json.loads(g)["merged_from"] == [t.ids[int(p)] for p in t._parents[j]] for g, j in zip(got, m))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_storage_keeps_every_guarantee(dtype):
    st = synthetic_store(600, tenants=3, dim=32, seed=2)
    cfg = CompressConfig(merge=MergeConfig(ratio=0.5, schedule="matching"), storage_dtype=dtype)
    r = compress(st, cfg)
    names, codes = st.tenant_index()
    for j, name in enumerate(names):
        n = int((codes == j).sum())
        row = next(x for x in r.report.tenants if x["tenant"] == name)
        assert row["removed"] + row["shortfall"] == round(0.5 * n) and row["shortfall"] == 0
    srcs = [x for s in r.store.sources for x in s]
    assert sorted(srcs) == sorted(st.ids)  # every original in exactly one output node
    assert r.store.embeddings.dtype == torch.float32
    again = compress(st, cfg)
    assert again.store.ids == r.store.ids and torch.equal(again.store.embeddings, r.store.embeddings)


def test_build_trees_half_storage_and_chunked_lists():
    """No padded copy of the vectors: the buckets read them by node row (the store's own
    tensor when it is in the storage dtype); half storage keeps float32 cosines; neighbour
    lists do not depend on the gather tile_elements."""
    from memforest_gpu.config import SpanningConfig

    st = synthetic_store(300, tenants=1, dim=16, seed=3)
    tree = torch.arange(300) % 7
    size = np.bincount(tree.numpy(), minlength=7)
    full = build_trees(tree, size, st.embeddings, st.timestamps, st.tenant_codes, None)
    half = build_trees(tree, size, st.embeddings, st.timestamps, st.tenant_codes, None, dtype=torch.float16)
    assert full.vectors.base is st.embeddings and half.vectors.base.dtype == torch.float16
    for a, h in zip(full.buckets, half.buckets):
        assert not hasattr(a, "X") and h.W.dtype == torch.float32 and (h.W - a.W).abs().max() < 2e-3
    knn = SpanningConfig(knn=5, knn_above=0, time_weight=0.5)  # lists for these ~43-node trees too
    lists = build_trees(tree, size, st.embeddings, st.timestamps, st.tenant_codes, None, config=knn)
    tiny = build_trees(tree, size, st.embeddings, st.timestamps, st.tenant_codes, None, config=knn, tile_elements=64)
    for a, b in zip(lists.buckets, tiny.buckets):
        assert a.graph == "knn" and a.W is None and a.nbr.shape == (a.slot.shape[0], a.m, 6)
        assert torch.equal(a.nbr, b.nbr) and torch.equal(a.cs, b.cs)


def test_storage_dtype_is_checked():
    assert "storage_dtype must be one of" in err(CompressConfig, storage_dtype="int8")


def test_outputs_written_in_order_from_arrow_columns(tmp_path):
    st = synthetic_store(200, tenants=3, dim=8, seed=4)
    r = compress(st, CompressConfig(merge=MergeConfig(ratio=0.4, vectors="float32")))  # read back exactly
    write_store(r.store, tmp_path / "o.parquet")
    write_store(r.store, tmp_path / "o.jsonl")
    back = read_store(tmp_path / "o.parquet")
    assert_same(r.store, back)
    rows = [json.loads(x) for x in (tmp_path / "o.jsonl").read_text().splitlines()]
    rows = [x for x in rows if "__memforest__" not in x]  # the header line (the store's forest)
    assert [x["id"] for x in rows] == list(r.store.ids)
    merged = [m for m in r.store.metadata if "merged_from" in m]
    assert len(merged) == sum(1 for s in r.store.sources if len(s) > 1) > 0


def test_parquet_written_in_row_groups(tmp_path, monkeypatch):
    monkeypatch.setattr(parquet_mod, "ROW_GROUP_ROWS", 4)
    s = make_store(n=11)
    write_store(s, tmp_path / "s.parquet")
    assert pq.ParquetFile(tmp_path / "s.parquet").metadata.num_row_groups == 3
    monkeypatch.setattr(parquet_mod, "_BATCH_ROWS", 3)  # batches across row-group boundaries
    assert_same(s, read_store(tmp_path / "s.parquet"))
    assert_same(s.select_tenant("bob"), read_store(tmp_path / "s.parquet", tenants=["bob"]))


def test_assemble_from_round_blocks_equals_one_tensor():
    from memforest_gpu.engine.output import assemble

    st = synthetic_store(6, tenants=1, dim=4, seed=5)
    table = NodeTable(st)
    for a, b in ((0, 1), (2, 3), (6, 4)):  # rows 6, 7, 8
        table.add(a, b, f"m{a}{b}")
    merged = torch.nn.functional.normalize(torch.randn(3, 4, generator=torch.Generator().manual_seed(0)), dim=1)
    live = np.array([False, False, False, False, False, True, False, True, True])
    one = assemble(table, live, st.embeddings, merged)
    blocks = [merged[:2], merged[2:]]
    two = assemble(table, live, st.embeddings, blocks)
    assert blocks == [None, None]  # released as read
    assert two.ids == one.ids and torch.equal(two.embeddings, one.embeddings)
    assert one.texts == ["m64", "m23", st.texts[5]]  # by earliest original inside
