"""A store's size (store/size.py): vector rows a search scores and bytes of texts and vectors,
against the uncompressed store in the same encoding; reported by compress, info and eval."""
from __future__ import annotations

import dataclasses
import json

import pytest
from compact_helpers import arrivals, store_of

from memforest_gpu import CompressConfig, compress
from memforest_gpu.cli.commands import main
from memforest_gpu.store.io import read_store, write_store
from memforest_gpu.store.size import bytes_per_vector, store_size
from memforest_gpu.store.synthetic import synthetic_store


def _cfg(keys: int, vectors: str = "int8") -> CompressConfig:
    c = CompressConfig.preset("memforest")
    return dataclasses.replace(c, merge=dataclasses.replace(c.merge, keys=keys, vectors=vectors))


@pytest.fixture(scope="module")
def store():
    return synthetic_store(300, tenants=3, dim=16, seed=2)


def test_an_uncompressed_stores_size_by_hand(store):
    text = sum(len(t.encode("utf-8")) for t in store.texts)
    for enc, per in (("float32", 64), ("int8", 16)):
        z = store_size(store, enc)
        assert bytes_per_vector(16, enc) == per
        assert (z.nodes, z.originals, z.rows, z.vectors) == (300, 300, 300, 300)
        assert z.text_bytes == text and z.vector_bytes == 300 * per and z.bytes == text + 300 * per


def test_one_vector_per_node_against_every_sources_key(store):
    one = compress(store, _cfg(1), device="cpu").store
    z = store_size(one)
    assert z.encoding == "int8" and z.rows == z.vectors == z.nodes == len(one) == 150 and z.originals == 300
    keyed = compress(store, _cfg(-1), device="cpu").store
    k = store_size(keyed)
    merged = sum(len(s) > 1 for s in keyed.sources)
    held = sum(len(s) for s in keyed.sources if len(s) > 1)
    assert k.rows == len(keyed) - merged + held == 300  # every source is a row again: regrouped, not compressed
    assert k.vectors == len(keyed) + held and k.vector_bytes == k.vectors * 16
    assert k.bytes > store_size(store, "int8").bytes > z.bytes


def test_compress_and_info_report_rows_and_bytes_against_the_same_encoding(store, tmp_path, capsys):
    src, out, rep = tmp_path / "in.parquet", tmp_path / "out.parquet", tmp_path / "r.json"
    write_store(store, src)
    assert main(["compress", str(src), str(out), "--embedder", "none", "--report", str(rep)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("size:"))
    d = json.load(open(rep))
    zin, zout = d["size_in"], d["size_out"]
    assert zin["encoding"] == zout["encoding"] == "int8" and zin["rows"] == 300 and zout["rows"] == 150
    assert zin["bytes"] == store_size(store, "int8").bytes
    assert line.startswith("size: 300 -> 150 vector rows searched (0.50 per memory)")
    assert f"{zout['bytes'] / zin['bytes']:.0%} of the uncompressed store in the same encoding (int8)" in line
    assert main(["info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["size"] == zout and info["uncompressed_vector_bytes"] == 300 * 16
    assert main(["info", str(out)]) == 0
    text = capsys.readouterr().out
    assert "150 vector rows searched (0.50 per memory), 150 vectors held" in text
    assert "uncompressed, in int8: 300 vectors" in text


def test_compaction_keeps_one_vector_per_node_whatever_arrived(tmp_path, capsys):
    """A tenant compacted again and again holds as many vectors as nodes: the budget bounds the
    store's rows and bytes, not only its node count."""
    path = tmp_path / "s.parquet"
    write_store(store_of(arrivals(0, 100, ["a", "b", "c"])), path)
    for step in range(1, 8):
        with open(f"{path}.inbox.jsonl", "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in arrivals(step, 40, ["a", "b", "c"]))
        assert main(["compact", str(path), "--max-nodes-per-tenant", "60", "--embedder", "none", "--quiet"]) == 0
        z = store_size(read_store(path))
        assert z.originals == 300 + 120 * step and z.nodes <= 180
        assert z.rows == z.vectors == z.nodes  # one row a node (<= 1.1 asked)
    capsys.readouterr()


def test_a_faiss_index_of_the_presets_store_holds_one_row_per_node(store):
    """The faiss index honours the bound: one vector a node, as many rows as the store's nodes
    (every source's key would index the input's count again)."""
    from extras import need

    need("faiss")
    from memforest_gpu.retrieval.index import IndexedRetriever

    for keys, rows in ((1, 150), (-1, 300)):
        out = compress(store, _cfg(keys), device="cpu").store
        r = IndexedRetriever(out, "faiss-flat")
        held = sum(getattr(ix, "inner", ix).index.ntotal for ix in r.indexes.values())
        assert held == rows == store_size(out).rows
