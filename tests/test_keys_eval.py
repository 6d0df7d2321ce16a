"""The retrieval rule of merged nodes in the evaluation: flags, the leave-one-out grid, and
the harness scoring every method's store by its keys."""
from __future__ import annotations

import argparse
import json

import pytest
from eval_fixtures import BagOfWordsEmbedder, duplicate_facts_benchmark, fact_budget

from memforest_gpu.config import CompressConfig, MergeConfig, preset
from memforest_gpu.evaluation.loo import candidate_grid, keys_fields


def test_keys_fields_and_the_grid():
    assert keys_fields("text") == {"keys": 0, "text_weight": 1.0}
    assert keys_fields("all:0.5") == {"keys": -1, "text_weight": 0.5}
    assert keys_fields("3") == {"keys": 3, "text_weight": 0.0}
    assert keys_fields(None) == {}
    with pytest.raises(ValueError, match="keys rule must be 'text' or K"):
        keys_fields("many:0.5")
    base = preset("memforest")
    grid = candidate_grid(("matching", "sequential"), (0.001,), (0.5,), (0.2,), base=base, time_rules=("gated:0.3",),
                          keys_rules=("text", "2:0.4"))
    assert [c.name for c in grid] == ["matching a=0.001 tw=0.5/gated:0.3 sw=0.2",
                                      "matching a=0.001 tw=0.5/gated:0.3 sw=0.2 keys=2:0.4",
                                      "sequential a=0.001 tw=0.5/gated:0.3 sw=0.2",
                                      "sequential a=0.001 tw=0.5/gated:0.3 sw=0.2 keys=2:0.4"]
    assert (grid[1].config.merge.keys, grid[1].config.merge.text_weight) == (2, 0.4)
    assert (grid[0].config.merge.keys, grid[0].config.merge.text_weight) == (0, 1.0)
    assert MergeConfig(keys=-1).max_keys is None and MergeConfig(keys=3).max_keys == 3


def test_flags_set_the_rule(capsys):
    from memforest_gpu.cli.commands import main as cli_main
    from memforest_gpu.cli.eval import _config
    from memforest_gpu.cli.eval_args import add_arguments as _add_arguments
    from memforest_gpu.cli.flags import keys_count

    assert keys_count("all") == -1 and keys_count("2") == 2
    with pytest.raises(SystemExit):
        cli_main(["compress", "--help"])
    assert "--keys K" in capsys.readouterr().out
    p = argparse.ArgumentParser()
    _add_arguments(p)
    cfg = _config(p.parse_args(["--benchmark", "x", "--keys", "all", "--text-weight", "0.3"]))
    assert (cfg.merge.keys, cfg.merge.text_weight) == (-1, 0.3)
    with pytest.raises(ValueError, match="--text-weight must be in"):
        _config(p.parse_args(["--benchmark", "x", "--text-weight", "1.5"]))


def test_leave_one_out_with_the_rule_in_the_grid(tmp_path, monkeypatch):
    """--loo-keys adds the rule to the grid; ToMe runs under the base config's rule; every
    candidate's store is scored by its own keys (the rule changes the scores, not the merges)."""
    import memforest_gpu.mergers.embedders as embedders
    from memforest_gpu.cli.eval import main
    from memforest_gpu.evaluation.benchmark import write_benchmark

    monkeypatch.setattr(embedders, "SentenceTransformerEmbedder", lambda *a, **k: BagOfWordsEmbedder())
    write_benchmark(duplicate_facts_benchmark(("t0", "t1", "t2")), str(tmp_path / "bench"))
    out = tmp_path / "loo"
    argv = ["--benchmark", str(tmp_path / "bench"), "--out", str(out), "--leave-one-out", "--ratios", "0.5",
            "--seeds", "0", "--loo-schedules", "matching", "--loo-alphas", "0.05", "--loo-time-weights", "0",
            "--loo-size-weights", "0.2", "--loo-keys", "text,x:0", "--loo-compare-rules", "", "--keys", "2",
            "--text-weight", "0.5", "-k", "2", "--max-tokens", str(fact_budget()), "--quiet"]
    assert main(argv) == 2  # "x:0" is not a rule (an error message, no run)
    argv[argv.index("text,x:0")] = "text,all:0"
    assert main(argv) == 0
    data = json.loads((out / "loo.json").read_text())
    names = set(data["candidates"])
    assert {"matching a=0.05 tw=0 sw=0.2", "matching a=0.05 tw=0 sw=0.2 keys=all:0", "tome"} <= names
    assert data["candidates"]["matching a=0.05 tw=0 sw=0.2 keys=all:0"]["config"]["merge"]["keys"] == -1
    assert data["candidates"]["tome"]["config"]["merge"]["keys"] == 2


def test_harness_scores_a_store_by_its_keys(monkeypatch):
    """The same compressed stores scored under two rules give different per-question scores
    only through retrieval: the merges (nodes, sources) are the same."""
    from memforest_gpu.evaluation.harness import EvalConfig, run_grid

    bench = duplicate_facts_benchmark(("t0", "t1"))
    emb = BagOfWordsEmbedder()
    stores = []
    import memforest_gpu.evaluation.harness as harness

    real = harness.compress_with

    def spy(*a, **k):
        res = real(*a, **k)
        stores.append(res.store)
        return res

    monkeypatch.setattr(harness, "compress_with", spy)
    for cfg in (CompressConfig(merge=MergeConfig(keys=0)), CompressConfig(merge=MergeConfig(keys=-1, text_weight=0.0))):
        run_grid(bench, ["memforest:matching"], [0.5], [0], embedder=emb, base_config=cfg,
                 eval_config=EvalConfig(k=2, max_tokens=fact_budget(), search_repeats=1))
    a, b = stores
    assert list(a.sources) == list(b.sources) and a.keys is None and b.keys is not None
