"""Tests for memforest_gpu.store.memory_store.MemoryStore: validation, normalisation, views."""
from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta, timezone

import numpy as np
import pytest
import torch

from memforest_gpu.store.memory_store import DEFAULT_TENANT, MemoryStore, as_embedding_tensor

T0 = 1683554160.0  # 2023-05-08T13:56:00Z
D = 4


def cols(n=3, **over):
    rng = np.random.default_rng(0)
    c = dict(
        ids=[f"m{i}" for i in range(n)],
        texts=[f"memory {i}" for i in range(n)],
        timestamps=[T0 + 60.0 * i for i in range(n)],
        embeddings=rng.standard_normal((n, D)).astype(np.float32),
    )
    c.update(over)
    return c


def recs(n=3, **over):
    c = cols(n)
    out = [{"id": i, "text": t, "timestamp": ts, "embedding": e.tolist()}
           for i, t, ts, e in zip(c["ids"], c["texts"], c["timestamps"], c["embeddings"])]
    for r in out:
        r.update(over)
    return out


def err(fn, *args, **kw) -> str:
    with pytest.raises(ValueError) as e:
        fn(*args, **kw)
    return str(e.value)


# --------------------------------------------------------------------------- validation errors
def test_empty_store():
    assert "at least one node" in err(MemoryStore.from_columns, **cols(0, embeddings=np.zeros((0, D), np.float32)))
    assert "at least one node" in err(MemoryStore.from_records, [])
    assert "at least one node" in err(MemoryStore.from_records, iter(()))


@pytest.mark.parametrize("key", ["id", "text", "timestamp"])
def test_record_missing_required_column(key):
    rs = recs(3)
    del rs[1][key]
    msg = err(MemoryStore.from_records, rs)
    assert f"'{key}'" in msg and "record 1" in msg and "missing" in msg


def test_record_not_a_dict():
    msg = err(MemoryStore.from_records, [recs(1)[0], ["m1", "text", T0]])
    assert "record 1" in msg and "list" in msg


def test_record_embedding_missing_for_some():
    rs = recs(3)
    del rs[2]["embedding"]
    msg = err(MemoryStore.from_records, rs)
    assert "'m2'" in msg and "embedding" in msg


def test_embeddings_missing_without_embedder():
    rs = [{k: v for k, v in r.items() if k != "embedding"} for r in recs(2)]
    assert "embedder" in err(MemoryStore.from_records, rs)
    assert "embedder" in err(MemoryStore.from_columns, **cols(2, embeddings=None))


def test_duplicate_ids():
    msg = err(MemoryStore.from_columns, **cols(3, ids=["a", "b", "a"]))
    assert "duplicate" in msg and "'a'" in msg
    # ids are strings: 1 and "1" are the same id
    msg = err(MemoryStore.from_columns, **cols(2, ids=[1, "1"]))
    assert "duplicate" in msg and "'1'" in msg


@pytest.mark.parametrize("bad", ["", None, True, 1.5, ["x"]])
def test_bad_id(bad):
    msg = err(MemoryStore.from_columns, **cols(2, ids=["a", bad]))
    assert "id" in msg and repr(bad) in msg


@pytest.mark.parametrize("value, word", [(float("nan"), "finite"), (float("inf"), "finite"),
                                         (-float("inf"), "finite")])
def test_non_finite_embedding(value, word):
    e = cols(3)["embeddings"].copy()
    e[1, 2] = value
    msg = err(MemoryStore.from_columns, **cols(3, embeddings=e))
    assert "'m1'" in msg and word in msg


def test_zero_norm_embedding():
    e = cols(3)["embeddings"].copy()
    e[2] = 0
    msg = err(MemoryStore.from_columns, **cols(3, embeddings=e))
    assert "'m2'" in msg and "norm" in msg


def test_mixed_dimension_list():
    e = [[1.0, 0.0, 0.0], [0.0, 1.0], [0.0, 0.0, 1.0]]
    msg = err(MemoryStore.from_columns, **cols(3, embeddings=e))
    assert "same dimension" in msg and "2" in msg and "3" in msg
    rs = recs(3)
    rs[1]["embedding"] = [1.0, 2.0]
    assert "same dimension" in err(MemoryStore.from_records, rs)


@pytest.mark.parametrize("bad, word", [
    ([1.0, 2.0, 3.0], "list of vectors"),  # flat list
    (np.ones(3, np.float32), "2-D"),
    (np.ones((3, 2, 2), np.float32), "2-D"),
    ([["a", "b"], ["c", "d"], ["e", "f"]], "numeric"),
    (np.ones((3, 2), bool), "floating point"),
    ("not an array", "str"),
])
def test_bad_embedding_container(bad, word):
    assert word in err(MemoryStore.from_columns, **cols(3, embeddings=bad))


def test_embedding_row_count_mismatch():
    msg = err(MemoryStore.from_columns, **cols(3, embeddings=np.ones((2, D), np.float32)))
    assert "one row per id (3)" in msg and "(2, 4)" in msg


@pytest.mark.parametrize("bad", ["yesterday", "2023-13-45", "", None, True, float("nan"), float("inf"), [1]])
def test_unparseable_timestamp_names_the_node(bad):
    msg = err(MemoryStore.from_columns, **cols(3, timestamps=[T0, bad, T0]))
    assert "'m1'" in msg and "timestamp" in msg
    if isinstance(bad, str) and bad:
        assert repr(bad) in msg


def test_unparseable_timestamp_in_records():
    rs = recs(2)
    rs[0]["timestamp"] = "last tuesday"
    msg = err(MemoryStore.from_records, rs)
    assert "'m0'" in msg and "'last tuesday'" in msg


@pytest.mark.parametrize("bad", ["", "   \n\t", None, 5, ["text"]])
def test_empty_or_non_string_text(bad):
    msg = err(MemoryStore.from_columns, **cols(3, texts=["ok", "ok", bad]))
    assert "'m2'" in msg and "text" in msg and "non-empty" in msg


def test_overlapping_sources():
    msg = err(MemoryStore.from_columns, **cols(3, sources=[["a", "b"], ["c"], ["b", "d"]]))
    assert "'b'" in msg and "'m0'" in msg and "'m2'" in msg and "overlap" in msg
    # a node's own id counts when its sources default to [id]
    msg = err(MemoryStore.from_columns, **cols(2, sources=[["m0", "m1"], None]))
    assert "'m1'" in msg and "overlap" in msg


@pytest.mark.parametrize("bad", ["m0", [], (), 5])
def test_bad_sources(bad):
    msg = err(MemoryStore.from_columns, **cols(2, sources=[bad, None]))
    assert "sources of node 'm0'" in msg


@pytest.mark.parametrize("col", ["texts", "timestamps", "tenants", "sources", "metadata"])
def test_length_mismatch(col):
    c = cols(3)
    c[col] = {"texts": ["a", "b"], "timestamps": [T0, T0], "tenants": ["x", "y"],
              "sources": [["a"], ["b"]], "metadata": [{}, {}]}[col]
    msg = err(MemoryStore.from_columns, **c)
    assert f"'{col}'" in msg and "(3)" in msg and "got 2" in msg


@pytest.mark.parametrize("bad", ["", True, 1.5, ["t"]])
def test_bad_tenant(bad):
    msg = err(MemoryStore.from_columns, **cols(2, tenants=["a", bad]))
    assert "tenant of node 'm1'" in msg


@pytest.mark.parametrize("bad", ["x", 5, ["a"]])
def test_bad_metadata(bad):
    msg = err(MemoryStore.from_columns, **cols(2, metadata=[{}, bad]))
    assert "metadata of node 'm1'" in msg


# --------------------------------------------------------------------------- accepted inputs
def _unit(e: np.ndarray) -> np.ndarray:
    e = np.asarray(e, dtype=np.float64)
    return e / np.linalg.norm(e, axis=1, keepdims=True)


@pytest.mark.parametrize("kind", ["numpy32", "numpy64", "torch32", "torch64", "list", "tuple", "list-of-arrays",
                                  "int"])
def test_embedding_containers_accepted_and_normalised(kind):
    raw = np.array([[3.0, 4.0, 0.0, 0.0], [0.0, 0.0, 2.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    e = {
        "numpy32": raw.astype(np.float32), "numpy64": raw, "torch32": torch.tensor(raw, dtype=torch.float32),
        "torch64": torch.tensor(raw), "list": raw.tolist(), "tuple": tuple(tuple(r) for r in raw.tolist()),
        "list-of-arrays": [r for r in raw.astype(np.float32)], "int": raw.astype(np.int64),
    }[kind]
    st = MemoryStore.from_columns(**cols(3, embeddings=e))
    assert st.embeddings.dtype == torch.float32 and st.embeddings.shape == (3, 4)
    assert st.dim == 4
    np.testing.assert_allclose(st.embeddings.numpy(), _unit(raw), atol=1e-6)
    np.testing.assert_allclose(st.embeddings.norm(dim=1).numpy(), 1.0, atol=1e-6)
    assert st.embeddings.is_contiguous()


def test_unit_embeddings_kept_exactly():
    e = torch.nn.functional.normalize(torch.randn(5, 8, generator=torch.Generator().manual_seed(0)), dim=1)
    st = MemoryStore.from_columns(**cols(5, embeddings=e))
    assert torch.equal(st.embeddings, e)


def test_caller_array_not_modified():
    e = np.array([[3.0, 4.0], [1.0, 0.0]], dtype=np.float32)
    MemoryStore.from_columns(**cols(2, embeddings=e))
    assert e.tolist() == [[3.0, 4.0], [1.0, 0.0]]


def test_large_finite_embedding_is_normalised():
    e = np.array([[1e30, 1e30], [1.0, 0.0]], dtype=np.float32)
    st = MemoryStore.from_columns(**cols(2, embeddings=e))
    np.testing.assert_allclose(st.embeddings[0].numpy(), [math.sqrt(0.5)] * 2, atol=1e-6)


def test_list_of_torch_vectors_accepted():
    e = [torch.tensor([3.0, 4.0]), torch.tensor([0.0, 1.0])]
    st = MemoryStore.from_columns(**cols(2, embeddings=e))
    np.testing.assert_allclose(st.embeddings.numpy(), [[0.6, 0.8], [0.0, 1.0]], atol=1e-6)


def test_as_embedding_tensor_passthrough():
    t = torch.ones(2, 3)
    assert as_embedding_tensor(t) is t  # float32 on its device: nothing copied
    assert as_embedding_tensor(t, device=torch.device("cpu")) is t


@pytest.mark.parametrize("value, expect", [
    ("2023-05-08T13:56:00Z", T0),
    ("2023-05-08T13:56:00+00:00", T0),
    ("2023-05-08T15:56:00+02:00", T0),
    ("2023-05-08T13:56:00", T0),  # naive: UTC
    ("2023-05-08 13:56:00", T0),
    ("2023-05-08", T0 - (13 * 3600 + 56 * 60)),
    (" 2023-05-08T13:56:00Z ", T0),
    ("1683554160", T0),
    ("1683554160.5", T0 + 0.5),
    (1683554160, T0),
    (np.int64(1683554160), T0),
    (np.float32(16.0), 16.0),
    (datetime(2023, 5, 8, 13, 56, tzinfo=UTC), T0),
    (datetime(2023, 5, 8, 13, 56), T0),  # naive datetime: UTC
    (datetime(2023, 5, 8, 14, 56, tzinfo=timezone(timedelta(hours=1))), T0),
])
def test_timestamps_parsed(value, expect):
    st = MemoryStore.from_columns(**cols(1, timestamps=[value]))
    assert st.timestamps.dtype == torch.float64
    assert st.timestamps.tolist() == [pytest.approx(expect, abs=1e-6)]


def test_timestamp_containers():
    for ts in (np.array([T0, T0 + 1, T0 + 2]), torch.tensor([T0, T0 + 1, T0 + 2], dtype=torch.float64)):
        st = MemoryStore.from_columns(**cols(3, timestamps=ts))
        assert st.timestamps.tolist() == [T0, T0 + 1, T0 + 2]
    assert st.timestamps.device == st.embeddings.device


def test_defaults_and_coercions():
    st = MemoryStore.from_columns(**cols(4, ids=[np.int64(7), 8, "x", "y"],
                                         tenants=[None, float("nan"), 5, "bob"],
                                         sources=[None, np.array(["o1", "o2"]), ("o3",), [9]],
                                         metadata=[None, {"k": 1}, {}, {"n": [1, 2]}]))
    assert st.ids == ["7", "8", "x", "y"]
    assert st.tenants == [DEFAULT_TENANT, DEFAULT_TENANT, "5", "bob"]
    assert st.sources == [["7"], ["o1", "o2"], ["o3"], ["9"]]
    assert st.metadata == [{}, {"k": 1}, {}, {"n": [1, 2]}]
    plain = MemoryStore.from_columns(**cols(2))
    assert plain.tenants == [DEFAULT_TENANT] * 2 and plain.sources == [["m0"], ["m1"]]
    assert plain.metadata == [{}, {}] and plain.embedder is None


def test_metadata_copied():
    meta = [{"a": 1}, {"b": 2}]
    st = MemoryStore.from_columns(**cols(2, metadata=meta))
    st.metadata[0]["a"] = 99
    assert meta[0]["a"] == 1


class _Emb:
    name = "fake"
    dim = 3

    def __init__(self):
        self.calls = []

    def embed(self, texts):
        self.calls.append(list(texts))
        return torch.tensor([[float(len(t)), 1.0, 0.0] for t in texts])


def test_embedder_used_when_embeddings_missing():
    emb = _Emb()
    st = MemoryStore.from_columns(**cols(2, embeddings=None), embedder=emb)
    assert emb.calls == [["memory 0", "memory 1"]]
    assert st.embedder == "fake" and st.dim == 3
    np.testing.assert_allclose(st.embeddings.norm(dim=1).numpy(), 1.0, atol=1e-6)
    rs = [{k: v for k, v in r.items() if k != "embedding"} for r in recs(2)]
    st2 = MemoryStore.from_records(rs, embedder=_Emb())
    assert torch.equal(st.embeddings, st2.embeddings)


def test_embedder_name_recorded():
    assert MemoryStore.from_columns(**cols(2), embedder="all-MiniLM-L6-v2").embedder == "all-MiniLM-L6-v2"
    assert MemoryStore.from_columns(**cols(2), embedder=_Emb()).embedder == "fake"


def test_from_records_full():
    rs = recs(3)
    rs[0].update(tenant="alice", sources=["m0", "old"], metadata={"speaker": "A"})
    rs[1]["timestamp"] = "2023-05-08T13:57:00Z"
    st = MemoryStore.from_records(rs)
    assert st.ids == ["m0", "m1", "m2"]
    assert st.tenants == ["alice", DEFAULT_TENANT, DEFAULT_TENANT]
    assert st.sources[0] == ["m0", "old"] and st.metadata[0] == {"speaker": "A"}
    assert st.timestamps.tolist() == [T0, T0 + 60.0, T0 + 120.0]
    np.testing.assert_allclose(st.embeddings.numpy(), _unit(cols(3)["embeddings"]), atol=1e-6)


def test_device_argument():
    st = MemoryStore.from_columns(**cols(2), device="cpu")
    assert st.device == torch.device("cpu") and st.timestamps.device == torch.device("cpu")
    assert "device" in err(MemoryStore.from_columns, **cols(2), device="tpu")


# --------------------------------------------------------------------------- views
@pytest.fixture
def store():
    n = 6
    return MemoryStore.from_columns(**cols(n, tenants=["bob", "alice", "bob", "carol", "alice", "bob"],
                                           sources=[["m0"], ["m1", "o1"], None, None, None, None],
                                           metadata=[{"i": i} for i in range(n)]),
                                    embedder="fake-model")


def test_len_dim_device(store):
    assert len(store) == 6 and store.dim == D and store.device.type == "cpu"


def test_tenant_names_and_index(store):
    assert store.tenant_names() == ["bob", "alice", "carol"]  # first appearance
    names, codes = store.tenant_index()
    assert names == ["bob", "alice", "carol"]
    assert codes.tolist() == [0, 1, 0, 2, 1, 0] and codes.dtype == torch.int64


def test_take(store):
    sub = store.take([4, 0, 4])
    assert sub.ids == ["m4", "m0", "m4"]
    assert torch.equal(sub.embeddings, store.embeddings[[4, 0, 4]])
    assert sub.timestamps.tolist() == [store.timestamps[4].item(), store.timestamps[0].item()] + \
        [store.timestamps[4].item()]
    assert sub.tenants == ["alice", "bob", "alice"] and sub.embedder == "fake-model"
    assert store.take(torch.tensor([1, 2])).ids == ["m1", "m2"]
    assert store.take([]).ids == []
    # copies: editing the view never touches the store
    sub.sources[1].append("zzz")
    sub.metadata[1]["i"] = 99
    assert store.sources[0] == ["m0"] and store.metadata[0] == {"i": 0}


def test_select_tenant(store):
    bob = store.select_tenant("bob")
    assert bob.ids == ["m0", "m2", "m5"] and set(bob.tenants) == {"bob"}
    assert torch.equal(bob.embeddings, store.embeddings[[0, 2, 5]])
    msg = err(store.select_tenant, "dave")
    assert "'dave'" in msg and "bob" in msg and "alice" in msg and "carol" in msg


def test_info(store):
    info = store.info()
    assert info["nodes"] == 6 and info["originals"] == 7 and info["tenants"] == 3
    assert info["nodes_per_tenant"] == {"bob": 3, "alice": 2, "carol": 1}
    assert info["dim"] == D and info["embedder"] == "fake-model" and info["merged_nodes"] == 1
    assert info["time_first"] == "8 May 2023" and info["time_last"] == "8 May 2023"


def test_records_round_trip(store):
    rs = store.records()
    assert [r["id"] for r in rs] == store.ids
    assert set(rs[0]) == {"id", "text", "timestamp", "tenant", "sources", "metadata", "embedding"}
    assert rs[1]["sources"] == ["m1", "o1"] and rs[3]["tenant"] == "carol" and rs[2]["metadata"] == {"i": 2}
    assert isinstance(rs[0]["timestamp"], float) and isinstance(rs[0]["embedding"], list)
    back = MemoryStore.from_records(rs)
    assert back.ids == store.ids and back.texts == store.texts and back.tenants == store.tenants
    assert back.sources == store.sources and back.metadata == store.metadata
    assert torch.equal(back.timestamps, store.timestamps)
    assert torch.equal(back.embeddings, store.embeddings)  # unit rows are kept bit-exact
    rs[0]["sources"].append("x")
    assert store.sources[0] == ["m0"]
    assert "embedding" not in store.records(with_embedding=False)[0]


def test_to(store):
    moved = store.to("cpu")
    assert moved.ids == store.ids and torch.equal(moved.embeddings, store.embeddings)
