"""A compressed store rewritten by other Parquet tools (pyarrow rows, pandas, Polars, DuckDB),
which keep the columns and drop the file's metadata, and a tenant erased with DuckDB: memforest
still reads it (info, search with the same hits, compress, compact)."""
from __future__ import annotations

import json
import logging

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from extras import need

from memforest_gpu.cli.commands import main
from memforest_gpu.config import RetrievalConfig
from memforest_gpu.retrieval.retriever import Retriever
from memforest_gpu.store.io import read_store

DIM = 16


def _input(path, n=80, tenants=("u1", "u2", "u3")):
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((5, DIM))
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"m{i}", "text": f"Memory {i} about topic {i % 5}.",
                                "timestamp": 1.7e9 + 3600 * i, "tenant": tenants[i % len(tenants)],
                                "embedding": (centres[i % 5] + 0.3 * rng.standard_normal(DIM)).tolist()}) + "\n")
    return path


@pytest.fixture(scope="module")
def compressed(tmp_path_factory):
    """A store compressed with every source's key (--keys all: the keys' columns and rule) in int8
    codes, then compacted once so that it also holds the event trees' state."""
    d = tmp_path_factory.mktemp("interop")
    out = d / "store.parquet"
    assert main(["compress", str(_input(d / "in.jsonl")), str(out), "--ratio", "0.5", "--embedder", "none",
                 "--keys", "all", "--text-weight", "0.5", "--quiet"]) == 0
    assert main(["compact", str(out), "--max-nodes-per-tenant", "20", "--embedder", "none", "--quiet"]) == 0
    return out


def _hits(path, tenants=("u1", "u2", "u3")):
    store = read_store(path)
    q = torch.nn.functional.normalize(torch.as_tensor(np.random.default_rng(1).standard_normal((4 * len(tenants), DIM)),
                                                      dtype=torch.float32), dim=1)
    ten = [t for t in tenants for _ in range(4)]
    out = {}
    for agpr in (False, True):
        res = Retriever(store).search(q, tenants=ten, config=RetrievalConfig(k=5, agpr=agpr)).hits(store)
        out[agpr] = [[(h["id"], round(h["score"], 5)) for h in row] for row in res]
    return out


def _pyarrow_rows(src, dst):
    pq.write_table(pa.Table.from_pylist(pq.read_table(src).to_pylist()), dst)


def _pandas(src, dst):
    pd = need("pandas")
    pd.read_parquet(src).to_parquet(dst)


def _polars(src, dst):
    pl = need("polars")
    pl.read_parquet(src).write_parquet(dst)


def _duckdb(src, dst):
    duckdb = need("duckdb")
    duckdb.sql(f"COPY (SELECT * FROM read_parquet('{src}')) TO '{dst}' (FORMAT parquet)")


def _duckdb_erase(src, dst):
    """The usual way to erase a user: delete the tenant's rows, write the table back."""
    duckdb = need("duckdb")
    con = duckdb.connect()
    con.sql(f"CREATE TABLE t AS SELECT * FROM read_parquet('{src}')")
    con.sql("DELETE FROM t WHERE tenant = 'u2'")
    con.sql(f"COPY t TO '{dst}' (FORMAT parquet)")


REWRITES = {"pyarrow-rows": _pyarrow_rows, "pandas": _pandas, "polars": _polars, "duckdb": _duckdb}


def test_the_store_holds_keys_codes_and_trees(compressed):
    t = pq.read_table(compressed)
    assert t.schema.field("embedding").type.value_type == pa.int8()
    assert {"keys", "key_sources", "keys_rule", "tree"} <= set(t.column_names)
    store = read_store(compressed)
    assert store.keys is not None and store.keys.rule == {"text_weight": 0.5, "max_keys": None}
    assert store.vector_codes == "int8" and store.event_trees is not None and store.event_trees.tenants


@pytest.mark.parametrize("tool", sorted(REWRITES))
def test_a_rewritten_store_reads_searches_compresses_and_compacts(compressed, tmp_path, tool, caplog, capsys):
    dst = tmp_path / "rewritten.parquet"
    REWRITES[tool](str(compressed), str(dst))
    assert not (pq.read_schema(dst).metadata or {}).get(b"memforest.keys")  # the tool dropped the metadata
    with caplog.at_level(logging.WARNING):
        store = read_store(dst)
    before = read_store(compressed)
    assert store.keys is not None and store.keys.rule == before.keys.rule  # from the keys_rule column
    assert store.vector_codes == "int8"
    assert torch.equal(store.keys.vectors, before.keys.vectors) and torch.equal(store.embeddings, before.embeddings)
    assert "event trees' state is missing" in caplog.text  # one line: re-partitioned at the next compaction
    assert _hits(dst) == _hits(compressed)
    assert main(["info", str(dst), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["nodes"] == len(before) and info["keys"] == len(before.keys.vectors)
    out = tmp_path / "again.parquet"
    assert main(["compress", str(dst), str(out), "--ratio", "0.3", "--embedder", "none", "--quiet"]) == 0
    again = read_store(out)
    assert sorted(x for s in again.sources for x in s) == sorted(x for s in before.sources for x in s)
    assert main(["compact", str(dst), "--max-nodes-per-tenant", "12", "--embedder", "none", "--quiet"]) == 0
    after = read_store(dst)
    assert sorted(x for s in after.sources for x in s) == sorted(x for s in before.sources for x in s)
    assert after.event_trees is not None and after.event_trees.tenants  # partitioned again, state written


@pytest.mark.parametrize("tool", sorted(REWRITES))
def test_the_default_stores_one_vector_per_node_survives_a_rewrite(tmp_path, tool, capsys):
    """The default preset's store (one blended vector per node, int8 codes, no key columns) reads
    and searches the same after a tool rewrote it without its metadata."""
    src = tmp_path / "store.parquet"
    assert main(["compress", str(_input(tmp_path / "in.jsonl")), str(src), "--ratio", "0.5", "--embedder", "none",
                 "--quiet"]) == 0
    capsys.readouterr()
    before = read_store(src)
    assert before.keys is None and "keys" not in pq.read_schema(src).names and before.vector_codes == "int8"
    dst = tmp_path / "rewritten.parquet"
    REWRITES[tool](str(src), str(dst))
    store = read_store(dst)
    assert store.keys is None and store.vector_codes == "int8" and torch.equal(store.embeddings, before.embeddings)
    assert _hits(dst) == _hits(src)
    assert main(["info", str(dst), "--json"]) == 0
    size = json.loads(capsys.readouterr().out)["size"]
    assert size["rows"] == size["vectors"] == len(before) and size["originals"] == 80


@pytest.fixture(scope="module")
def named(tmp_path_factory):
    """A store without vectors compressed by the default preset: embedded with all-MiniLM-L6-v2,
    which the file records."""
    d = tmp_path_factory.mktemp("named")
    src, out = d / "in.jsonl", d / "store.parquet"
    with open(src, "w") as f:
        for i in range(24):
            f.write(json.dumps({"id": f"m{i}", "text": f"Memory {i}: {TOPICS[i % 4]}", "timestamp": 1.7e9 + 3600 * i,
                                "tenant": "u1"}) + "\n")
    assert main(["compress", str(src), str(out), "--ratio", "0.3", "--quiet"]) == 0
    return out


TOPICS = ["we hiked up the mountain trail at dawn", "the new espresso machine broke again",
          "my sister adopted a grey kitten", "the quarterly budget review went badly"]


@pytest.mark.parametrize("tool", sorted(REWRITES))
def test_a_rewritten_store_is_searched_with_its_model_without_a_flag(named, tmp_path, tool, capsys):
    dst = tmp_path / "rewritten.parquet"
    REWRITES[tool](str(named), str(dst))
    assert not (pq.read_schema(dst).metadata or {}).get(b"memforest.embedder")  # the tool dropped the metadata
    assert read_store(dst).embedder == read_store(named).embedder == "all-MiniLM-L6-v2"  # the embedder column
    query = ["a cat joined the family", "--tenant", "u1", "-k", "3", "--json"]
    assert main(["search", str(named), *query]) == 0
    before = json.loads(capsys.readouterr().out)
    assert main(["search", str(dst), *query]) == 0, capsys.readouterr().err
    after = json.loads(capsys.readouterr().out)
    assert [(h["id"], round(h["score"], 5)) for h in after] == [(h["id"], round(h["score"], 5)) for h in before]
    assert "kitten" in before[0]["text"]


def test_the_embedder_column_names_one_model(named, tmp_path, capsys):
    t = pq.read_table(named).replace_schema_metadata(None)
    names = ["all-MiniLM-L6-v2"] * (len(t) - 1) + ["other-model"]
    t = t.set_column(t.schema.get_field_index("embedder"), "embedder", pa.array(names))
    dst = tmp_path / "two.parquet"
    pq.write_table(t, dst)
    assert main(["info", str(dst)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "embedder must be the same on every row" in err[0] and "other-model" in err[0], err


def test_a_tenant_erased_with_duckdb(compressed, tmp_path, capsys):
    dst = tmp_path / "erased.parquet"
    _duckdb_erase(str(compressed), str(dst))
    store = read_store(dst)
    assert "u2" not in store.tenant_names() and len(store) < len(read_store(compressed))
    assert store.keys is not None
    assert _hits(dst, ("u1", "u3")) == _hits(compressed, ("u1", "u3"))
    assert main(["info", str(dst)]) == 0
    assert main(["compact", str(dst), "--max-nodes-per-tenant", "12", "--embedder", "none", "--quiet"]) == 0
    assert "u2" not in read_store(dst).tenant_names()


def test_keys_without_any_rule_read_with_the_default_and_a_warning(compressed, tmp_path, caplog):
    t = pq.read_table(compressed)
    t = t.drop_columns(["keys_rule"]).replace_schema_metadata(None)
    dst = tmp_path / "norule.parquet"
    pq.write_table(t, dst)
    with caplog.at_level(logging.WARNING):
        store = read_store(dst)
    assert store.keys.rule == {"text_weight": 0.5, "max_keys": None}
    assert "keys' rule is missing" in caplog.text


def test_compact_keeps_the_codes_and_the_rule_or_refuses_another(compressed, tmp_path, capsys):
    dst = tmp_path / "c.parquet"
    dst.write_bytes(compressed.read_bytes())
    # no --keys / --text-weight: the store's own rule (every source, 0.5), whatever the preset says
    assert main(["compact", str(dst), "--max-nodes-per-tenant", "10", "--embedder", "none", "--quiet"]) == 0
    out = read_store(dst)
    assert out.vector_codes == "int8" and pq.read_schema(dst).field("embedding").type.value_type == pa.int8()
    assert out.keys.rule == {"text_weight": 0.5, "max_keys": None}
    before = dst.read_bytes()
    for flags in (["--keys", "2"], ["--text-weight", "0.9"], ["--keys", "0"]):
        capsys.readouterr()
        assert main(["compact", str(dst), "--max-nodes-per-tenant", "5", "--embedder", "none", "--quiet",
                     *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "must be the store's rule (--keys all --text-weight 0.5)" in err[0]
        assert dst.read_bytes() == before  # nothing written
    # another rule is a new compression of the store: every node's keys follow it
    new = tmp_path / "k2.parquet"
    assert main(["compress", str(dst), str(new), "--ratio", "0.2", "--keys", "2", "--text-weight", "0.7",
                 "--embedder", "none", "--quiet"]) == 0
    k2 = read_store(new)  # reading checks every node against the rule (at most 2 keys, each source once)
    assert k2.keys.rule == {"text_weight": 0.7, "max_keys": 2} and int(k2.keys.counts.max()) <= 2
