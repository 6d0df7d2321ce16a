"""The grid end to end on a synthetic benchmark whose right answers are known."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from eval_fixtures import BagOfWordsEmbedder, duplicate_facts_benchmark, fact_budget

from memforest_gpu.cli.eval import main
from memforest_gpu.evaluation import CachedEmbedder, EvalConfig, run_grid, write_outputs
from memforest_gpu.evaluation.benchmark import write_benchmark
from memforest_gpu.evaluation.result_files import load_result, markdown

FIELDS = {"benchmark", "method", "schedule", "ratio", "seed", "retriever", "cut", "metric", "category", "value"}
METHODS = ["memforest", "memforest:matching", "memforest-min-spanning", "tome", "random_prune"]


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    out = tmp_path_factory.mktemp("eval")
    inner = BagOfWordsEmbedder()
    emb = CachedEmbedder(inner, out / ".cache")
    res = run_grid(duplicate_facts_benchmark(), METHODS, [0.5], [0, 1], embedder=emb,
                   eval_config=EvalConfig(k=2, max_tokens=fact_budget(), search_repeats=1))
    return out, res, inner


def _value(res, method, metric, *, schedule=None, retriever="plain", cut="B", category="all", seed=0):
    hits = [r["value"] for r in res.records
            if r["method"] == method and r["metric"] == metric and r["retriever"] == retriever and r["cut"] == cut
            and r["category"] == category and r["seed"] == seed and (schedule is None or r["schedule"] == schedule)]
    assert len(hits) == 1, (method, metric, hits)
    return hits[0]


def test_records_are_flat_and_complete(grid):
    _, res, _ = grid
    assert all(set(r) == FIELDS for r in res.records)
    labels = {(r["method"], r["schedule"]) for r in res.records}
    assert ("memforest", "sequential") in labels and ("memforest", "matching") in labels
    assert ("tome", "-") in labels and ("none", "-") in labels
    metrics = {r["metric"] for r in res.records}
    assert {"ansr", "evr", "ctx", "ansr_retention", "evr_retention", "search_speedup", "ratio_reached"} <= metrics
    cats = {r["category"] for r in res.records if r["metric"] == "ansr"}
    assert cats == {"1", "2", "all"}
    # the uncompressed store finds every answer within a one-fact budget
    assert _value(res, "none", "ansr") == 1.0
    assert _value(res, "none", "ansr_retention") == 1.0
    assert _value(res, "none", "ctx", cut="B") == fact_budget()


def test_each_store_reports_its_rows_and_bytes_against_the_uncompressed_one(grid):
    _, res, _ = grid
    assert _value(res, "none", "rows_share", retriever="-", cut="-") == 1.0
    assert _value(res, "none", "bytes_share", retriever="-", cut="-") == 1.0
    n = _value(res, "none", "rows", retriever="-", cut="-")
    for method, schedule in (("memforest", "matching"), ("tome", None), ("random_prune", None)):
        rows = _value(res, method, "rows", schedule=schedule, retriever="-", cut="-")
        assert rows == _value(res, method, "nodes", schedule=schedule, retriever="-", cut="-") == n / 2
        share = _value(res, method, "bytes_share", schedule=schedule, retriever="-", cut="-")
        assert 0 < share < 1
    table = markdown(res)
    assert "| rows | bytes % |" in table


def test_only_the_maximum_spanning_tree_keeps_every_answer(grid):
    _, res, _ = grid
    for seed in (0, 1):
        assert _value(res, "memforest", "ansr_retention", schedule="sequential", seed=seed) == 1.0
        assert _value(res, "memforest", "ansr_retention", schedule="matching", seed=seed) == 1.0
        # each fact's two copies are its evidence: one fits the budget uncompressed, both once merged
        assert _value(res, "none", "evr") == 0.5
        assert _value(res, "memforest", "evr", schedule="sequential", seed=seed) == 1.0
        assert _value(res, "memforest-min-spanning", "ansr_retention", seed=seed) < 0.9
        assert _value(res, "memforest", "ratio_reached", schedule="sequential", retriever="-", cut="-",
                      seed=seed) == 0.5
        assert _value(res, "memforest", "search_speedup", schedule="sequential", cut="-", seed=seed) > 0
    # outputs that cannot depend on the seed (ToMe; MemForest with one cluster per tenant) are computed once
    for method, schedule in (("tome", "-"), ("memforest", "sequential")):
        t = [_value(res, method, "compress_s", schedule=schedule, retriever="-", cut="-", seed=s) for s in (0, 1)]
        assert t[0] == t[1]
    t = [_value(res, "random_prune", "compress_s", retriever="-", cut="-", seed=s) for s in (0, 1)]
    assert t[0] != t[1]


def test_outputs_and_cached_rerun(grid):
    out, res, inner = grid
    paths = write_outputs(res, str(out), bootstrap=200)
    with open(paths["json"]) as f:
        data = json.load(f)
    assert data["meta"]["merger"] == "extractive" and data["meta"]["questions"] == 8
    diffs = [r for r in data["records"] if r["metric"] == "ansr_retention_diff_vs_memforest:sequential"]
    assert {(r["method"], r["schedule"]) for r in diffs} >= {("tome", "-"), ("memforest-min-spanning", "sequential")}
    assert all(set(r) == FIELDS for r in data["records"])
    ev_b = [r for r in data["records"]
            if r["metric"] == "evr_retention_diff_vs_memforest:sequential" and r["cut"] == "B"]
    assert {(r["method"], r["schedule"]) for r in ev_b} == {(r["method"], r["schedule"]) for r in diffs}
    assert any(r["metric"] == "dates" and r["cut"] == "B" for r in data["records"])
    md = open(paths["md"]).read()
    assert "ratio 0.5" in md and "memforest-min-spanning" in md and "extractive" in md
    assert "| Δ EvR@B | call |" in md and "Dates@B" in md
    # AnsR-content beside AnsR@B, in the tables and the comparisons; calls from the cluster bootstrap
    assert "AnsR@B all | % | AnsR-c@B all | % |" in md and "AnsR@B % / AnsR-c@B % / EvR@2 %" in md
    assert "| Δ AnsR@B | call | Δ AnsR-c@B | call |" in md and "cluster bootstrap over conversations" in md
    assert any(r["metric"] == "ansr_content_retention_diff_vs_memforest:sequential" for r in data["records"])
    assert _value(res, "none", "ansr_content_retention") == 1.0
    back = load_result(str(out))
    assert back.question_tenants == res.question_tenants == [q.tenant for q in duplicate_facts_benchmark().questions]
    assert markdown(back).splitlines()[:8] == markdown(res).splitlines()[:8]
    np.testing.assert_array_equal(back.per_question["memforest:sequential|0.5|0|plain|B|ansr"],
                                  res.per_question["memforest:sequential|0.5|0|plain|B|ansr"])
    # a second grid on the same cache embeds nothing
    again = BagOfWordsEmbedder()
    emb = CachedEmbedder(again, out / ".cache")
    res2 = run_grid(duplicate_facts_benchmark(), METHODS, [0.5], [0, 1], embedder=emb,
                    eval_config=EvalConfig(k=2, max_tokens=fact_budget(), search_repeats=1))
    assert inner.calls > 0 and again.calls == 0 and emb.misses == 0
    strip = [{k: v for k, v in r.items()} for r in res.records if "search" not in r["metric"]]
    strip2 = [{k: v for k, v in r.items()} for r in res2.records if "search" not in r["metric"]]
    assert [r for r in strip if r["metric"] != "compress_s"] == [r for r in strip2 if r["metric"] != "compress_s"]


def test_cli_export_and_report_only(tmp_path, grid):
    out, res, _ = grid
    bench = tmp_path / "bench"
    write_benchmark(duplicate_facts_benchmark(), str(bench))
    assert main(["--benchmark", str(bench), "--export", str(tmp_path / "copy")]) == 0
    assert os.path.exists(tmp_path / "copy" / "questions.jsonl")
    write_outputs(res, str(tmp_path / "rep"), bootstrap=50)
    assert main(["--benchmark", str(bench), "--out", str(tmp_path / "rep"), "--report-only", "--bootstrap", "50"]) == 0
    assert main(["--benchmark", str(bench), "--out", str(tmp_path / "x"), "--methods", "bogus"]) == 2
    assert main(["--benchmark", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x")]) == 2


def test_cli_maps_config_flags(capsys):
    import argparse

    from memforest_gpu.cli.commands import build_parser
    from memforest_gpu.cli.eval import _config, _methods
    from memforest_gpu.cli.eval_args import add_arguments as _add_arguments
    from memforest_gpu.cli.flags import config_from_args
    from memforest_gpu.config import CompressConfig, preset

    p = argparse.ArgumentParser()
    _add_arguments(p)
    c = _config(p.parse_args(["--benchmark", "b", "--size-weight", "0.3", "--time-weight", "0.5",
                              "--max-node-tokens", "128", "--time-rule", "gated", "--time-min-cos", "0.4",
                              "--cap-policy", "strict"]))
    assert (c.spanning.size_weight, c.spanning.time_weight, c.merge.max_node_tokens) == (0.3, 0.5, 128)
    assert (c.spanning.time_rule, c.spanning.time_min_cos, c.merge.cap_policy) == ("gated", 0.4, "strict")
    # no flag: the same config as `memforest compress` without flags (the default preset)
    d = _config(p.parse_args(["--benchmark", "b"]))
    assert d == preset("memforest") == CompressConfig() == config_from_args(
        build_parser().parse_args(["compress", "a", "b"]))
    assert _config(p.parse_args(["--benchmark", "b", "--preset", "paper"])) == preset("paper") != CompressConfig()
    # a bare memforest method takes the preset's schedule
    assert _methods("memforest,tome,memforest-no-size-edges", "matching") == [
        "memforest:matching", "tome", "memforest-no-size-edges:matching"]
    assert _methods("memforest:sequential", "matching") == ["memforest:sequential"]
    assert _methods("memforest-min-tree", "matching") == ["memforest-min-spanning:matching"]  # the old name
    assert "memforest-min-tree is renamed memforest-min-spanning" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"--time-rule must be one of \['flat', 'scaled', 'gated'\], got 'x'"):
        _config(p.parse_args(["--benchmark", "b", "--time-rule", "x"]))
