"""The `memforest` command line: a thin layer, clear errors, nothing written on failure."""
import json
import os

import numpy as np
import pytest

from memforest_gpu.cli.commands import main
from memforest_gpu.store.io import read_store


def _write_jsonl(path, n=60, tenants=("u1", "u2"), dim=16, seed=0, embed=True):
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((4, dim))
    with open(path, "w") as f:
        for i in range(n):
            rec = {"id": f"m{i}", "text": f"Memory number {i} about topic {i % 4}.",
                   "timestamp": 1.7e9 + 3600 * i, "tenant": tenants[i % len(tenants)]}
            if embed:
                rec["embedding"] = (centres[i % 4] + 0.3 * rng.standard_normal(dim)).tolist()
            f.write(json.dumps(rec) + "\n")
    return path


def test_compress_info_roundtrip(tmp_path, capsys):
    src = _write_jsonl(tmp_path / "in.jsonl")
    out = tmp_path / "out.parquet"
    rc = main(["compress", str(src), str(out), "--ratio", "0.5", "--embedder", "none", "--quiet",
               "--report", str(tmp_path / "report.json")])
    assert rc == 0
    text = capsys.readouterr().out
    assert "u1" in text and "u2" in text and "total" in text and "time:" in text
    store = read_store(out)
    assert len(store) == 30
    assert sorted(x for s in store.sources for x in s) == sorted(f"m{i}" for i in range(60))
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["nodes_out"] == 30 and rep["shortfall"] == 0
    assert main(["info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["nodes"] == 30 and info["originals"] == 60 and info["tenants"] == 2


@pytest.mark.parametrize("args, message", [
    (["--ratio", "1.5"], "--ratio must be in (0.0, 1.0)"),
    (["--ratio", "0"], "--ratio must be in (0.0, 1.0)"),
    (["--schedule", "greedy"], "--schedule must be one of ['sequential', 'matching']"),
    (["--alpha", "-0.5"], "--alpha must be in"),
    (["--graph", "sparse"], "--graph must be one of ['knn', 'dense']"),
    (["--knn", "0"], "--knn must be an integer >= 1"),
    (["--beta", "1.2"], "--beta must be in [0.0, 1.0]"),
    (["--eta", "-1"], "--eta must be in [0.0, 1.0]"),
    (["--degree-norm", "sum"], "--degree-norm must be one of ['none', 'max']"),
    (["--merger", "gpt"], "--merger must be one of"),
    (["--kmeans", "approx"], "--kmeans must be one of"),
    (["--size-weight", "2"], "--size-weight must be in [0.0, 1.0]"),
    (["--time-window", "0"], "--time-window must be"),
])
def test_bad_options_write_nothing(tmp_path, capsys, args, message):
    src = _write_jsonl(tmp_path / "in.jsonl")
    out = tmp_path / "out.parquet"
    rc = main(["compress", str(src), str(out), "--embedder", "none", "--quiet"] + args)
    assert rc == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
    assert os.listdir(tmp_path) == ["in.jsonl"]


@pytest.mark.parametrize("content, message", [
    ("", "at least one node"),
    ('{"id": "a", "text": "x", "timestamp": 1, "embedding": [1, 0]}\n'
     '{"id": "a", "text": "y", "timestamp": 2, "embedding": [0, 1]}\n', "duplicate id 'a'"),
    ('{"id": "a", "text": "x", "timestamp": "yesterday", "embedding": [1, 0]}\n', "timestamp of node 'a'"),
    ('{"id": "a", "text": "x", "embedding": [1, 0]}\n', "missing required column 'timestamp'"),
    ('{"id": "a", "text": "x", "timestamp": 1, "embedding": [0, 0]}\n', "non-zero norm"),
    ('{"id": "a", "text": "x", "timestamp": 1, "embedding": [1, 0]}\n'
     '{"id": "b", "text": "y", "timestamp": 2, "embedding": [0, 1, 0]}\n', "same"),
    ("not json\n", "line 1"),
])
def test_bad_input_write_nothing(tmp_path, capsys, content, message):
    src = tmp_path / "in.jsonl"
    src.write_text(content)
    out = tmp_path / "out.jsonl"
    rc = main(["compress", str(src), str(out), "--embedder", "none", "--quiet"])
    assert rc == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not out.exists()


def test_missing_and_wrong_format_files(tmp_path, capsys):
    assert main(["info", str(tmp_path / "nope.parquet")]) == 2
    assert "nope.parquet" in capsys.readouterr().err
    bad = tmp_path / "bad.parquet"
    bad.write_text("this is not parquet")
    assert main(["info", str(bad)]) == 2
    assert "bad.parquet" in capsys.readouterr().err
    odd = tmp_path / "store.csv"
    odd.write_text("id,text\n")
    assert main(["info", str(odd)]) == 2
    assert "parquet" in capsys.readouterr().err


def test_tiny_tenant_is_reported_not_crashed(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    with open(src, "w") as f:
        f.write(json.dumps({"id": "solo", "text": "Only memory.", "timestamp": 1, "tenant": "tiny",
                            "embedding": [1.0, 0.0]}) + "\n")
        for i in range(10):
            f.write(json.dumps({"id": f"b{i}", "text": f"Memory {i}.", "timestamp": 10 + i, "tenant": "big",
                                "embedding": [1.0, 0.1 * i]}) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["compress", str(src), str(out), "--ratio", "0.7", "--embedder", "none", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "short by 1" in text  # round(0.7 * 1) = 1 removal is impossible for a 1-node tenant
    store = read_store(out)
    assert store.tenants.count("tiny") == 1 and store.tenants.count("big") == 3


def test_search_needs_tenant_on_multi_tenant_store(tmp_path, capsys):
    src = _write_jsonl(tmp_path / "in.jsonl", n=12, embed=False)
    rc = main(["search", str(src), "topic 1", "--embedder", "default"])
    assert rc == 2
    assert "--tenant must be given for a store with several tenants" in capsys.readouterr().err  # the flag
    rc = main(["search", str(src), "Memory number 5", "--embedder", "default", "--tenant", "u2", "-k", "3",
               "--json"])
    assert rc == 0
    hits = json.loads(capsys.readouterr().out)
    assert len(hits) == 3 and all(h["tenant"] == "u2" for h in hits)
    assert hits[0]["id"] == "m5"


def test_every_config_flag_reaches_its_field_in_every_compress_command():
    from memforest_gpu.cli.adapters_args import add_parser as add_adapter_parsers
    from memforest_gpu.cli.commands import build_parser
    from memforest_gpu.cli.flags import config_from_args
    from memforest_gpu.config import CompressConfig, MergeConfig, PartitionConfig, SpanningConfig
    from memforest_gpu.distributed.__main__ import build_parser as build_distributed_parser

    flags = ["--ratio", "0.7", "--schedule", "matching", "--seed", "3", "--alpha", "0.01", "--beta", "0.6",
             "--window", "4", "--max-iter", "12", "--eta", "0.9", "--degree-norm", "max", "--time-weight", "0.5",
             "--time-window", "2", "--size-weight", "0.2", "--max-node-tokens", "100", "--keep-pattern", "^Name:",
             "--merge-within", "session", "--keys", "3", "--text-weight", "0.4", "--vectors", "float32"]
    want_spanning = SpanningConfig(eta=0.9, degree_norm="max", time_weight=0.5, time_window=2, size_weight=0.2)
    want_merge = MergeConfig(ratio=0.7, schedule="matching", max_node_tokens=100, seed=3, keep_pattern="^Name:",
                             merge_within="session", keys=3, text_weight=0.4, vectors="float32")
    part = dict(alpha=0.01, beta=0.6, window=4, max_iter=12, seed=3)
    import argparse

    top = argparse.ArgumentParser()
    add_adapter_parsers(top.add_subparsers(dest="cmd"))
    parsed = [
        (build_parser().parse_args(["compress", "a", "b", "--kmeans", "two-level"] + flags), "two-level"),
        (top.parse_args(["graph", "compress", "a", "b", "--kmeans", "two-level"] + flags), "two-level"),
        (build_distributed_parser().parse_args(["compress", "a", "b"] + flags), "exact"),  # sharded exact only
    ]
    for a, kmeans in parsed:
        assert config_from_args(a) == CompressConfig(partition=PartitionConfig(**part, kmeans=kmeans),
                                                     spanning=want_spanning, merge=want_merge)
    # no flags: the default preset ("memforest"), which is CompressConfig(); --preset paper: the paper's values
    assert config_from_args(build_parser().parse_args(["compress", "a", "b"])) == CompressConfig()
    assert CompressConfig() == CompressConfig.preset("memforest")
    assert (config_from_args(build_parser().parse_args(["compress", "a", "b", "--preset", "paper"]))
            == CompressConfig.preset("paper") != CompressConfig())
