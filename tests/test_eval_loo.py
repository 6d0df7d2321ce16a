"""Leave-one-conversation-out tuning (evaluation/loo.py): selection never sees the held-out
conversation; the end-to-end run picks the configuration that keeps every answer."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from eval_fixtures import BagOfWordsEmbedder, duplicate_facts_benchmark, fact_budget
from memforest_gpu.config import CompressConfig
from memforest_gpu.evaluation import EvalConfig
from memforest_gpu.evaluation.loo import (METRICS, Candidate, CandidateScores, candidate_grid, leave_one_out,
                                          loo_markdown, preset_choice, retention, score_candidates)


def _scores(per_tenant: dict[str, list[float]], tenants=("a", "b", "c")) -> CandidateScores:
    """Each candidate scores a constant per conversation (one question each, one ratio, one seed);
    the uncompressed store scores 1 everywhere."""
    ten = np.array(tenants)
    cands = [Candidate(n, CompressConfig()) for n in per_tenant]
    scores = {n: {(0.5, m): np.array([v], dtype=np.float64) for m in METRICS} for n, v in per_tenant.items()}
    base = {m: np.ones(len(ten)) for m in METRICS}
    return CandidateScores(scores, base, ten, [0.5], [0], cands)


def test_the_held_out_conversation_never_drives_the_choice():
    # "spiky" is best on conversation c alone; "steady" wins on any two conversations without c
    # but "spiky" wins the all-in mean: only the folds that train on c may choose it
    cs = _scores({"steady": [0.9, 0.9, 0.5], "spiky": [0.7, 0.7, 1.0]})
    assert retention(cs, "spiky", np.ones(3, bool)) > retention(cs, "steady", np.ones(3, bool))
    folds = {f["held_out"]: f for f in leave_one_out(cs, compare=("steady",))}
    assert folds["c"]["chosen"] == "steady"  # trained on a, b only
    assert folds["c"]["held_out_scores"]["steady"]["B:ansr_content"]["mean"] == pytest.approx(0.5)
    assert folds["a"]["chosen"] == "spiky" and folds["b"]["chosen"] == "spiky"  # (0.7+1)/2 > (0.9+0.5)/2
    assert folds["a"]["train_score"] == pytest.approx(0.85)
    assert preset_choice(list(folds.values())) == "spiky"  # chosen in 2 of 3 folds


def test_preset_choice_tie_goes_to_the_better_held_out_mean():
    folds = [{"chosen": "x", "held_out_scores": {"x": {"B:ansr_content": {"mean": 0.8}}}},
             {"chosen": "y", "held_out_scores": {"y": {"B:ansr_content": {"mean": 0.9}}}}]
    assert preset_choice(folds) == "y"


def test_candidate_grid_names_and_fields():
    c = candidate_grid(["matching"], [0.001], [0.5], [0.0, 0.2])
    assert [x.name for x in c] == ["matching a=0.001 tw=0.5 sw=0", "matching a=0.001 tw=0.5 sw=0.2"]
    assert c[1].config.partition.alpha == 0.001 and c[1].config.tree.size_weight == 0.2
    assert c[1].config.merge.schedule == "matching" and c[1].label == "memforest:matching"


def test_end_to_end_picks_the_tree_that_keeps_every_answer():
    bench = duplicate_facts_benchmark(("t0", "t1", "t2"))
    base = CompressConfig()
    good = Candidate("max-tree", base)
    bad = Candidate("min-tree", dataclasses.replace(base, tree=dataclasses.replace(base.tree, kind="min")))
    cs = score_candidates(bench, [bad, good, Candidate("tome", base, method="tome")], [0.5], [0, 1],
                          embedder=BagOfWordsEmbedder(), eval_config=EvalConfig(k=2, budget=fact_budget(),
                                                                                search_repeats=1))
    folds = leave_one_out(cs, pool=["min-tree", "max-tree"], compare=("min-tree", "tome"))
    assert [f["held_out"] for f in folds] == ["t0", "t1", "t2"]
    assert all(f["chosen"] == "max-tree" for f in folds)
    for f in folds:
        assert f["held_out_scores"]["max-tree"]["B:ansr"]["0.5"] == pytest.approx(1.0)
        assert f["held_out_scores"]["min-tree"]["B:ansr"]["0.5"] < 1.0
    md = loo_markdown(cs, folds, select="B:ansr_content", compare=("min-tree", "tome"), choice="max-tree")
    assert "**max-tree** (3 of 3 folds)" in md and "| t1 | 4 | max-tree |" in md
    json.dumps(folds)  # serialisable as written by the CLI


def test_cli_leave_one_out_writes_its_report(tmp_path, monkeypatch, capsys):
    import memforest_gpu.mergers.embedders as embedders
    from memforest_gpu.cli.eval import main
    from memforest_gpu.evaluation.benchmark import write_benchmark

    monkeypatch.setattr(embedders, "SentenceTransformerEmbedder", lambda *a, **k: BagOfWordsEmbedder())
    write_benchmark(duplicate_facts_benchmark(("t0", "t1", "t2")), str(tmp_path / "bench"))
    out = tmp_path / "loo"
    argv = ["--benchmark", str(tmp_path / "bench"), "--out", str(out), "--leave-one-out", "--ratios", "0.5",
            "--seeds", "0", "--loo-schedules", "sequential", "--loo-alphas", "0.05", "--loo-time-weights", "0",
            "--loo-size-weights", "0,0.2", "-k", "2", "--budget", str(fact_budget()), "--quiet"]
    assert main(argv) == 0
    data = json.loads((out / "loo.json").read_text())
    assert [f["held_out"] for f in data["folds"]] == ["t0", "t1", "t2"]
    assert set(data["candidates"]) == {"sequential a=0.05 tw=0 sw=0", "sequential a=0.05 tw=0 sw=0.2", "tome"}
    assert data["choice"] in data["candidates"] and data["compare"] == ["sequential a=0.05 tw=0 sw=0", "tome"]
    assert "Preset rule" in (out / "loo.md").read_text()
    assert "preset rule picks" in capsys.readouterr().out
    assert main(argv[:-1] + ["--loo-select", "B:nope"]) == 2
    # a second run's scores joined with the first: the same folds for the shared candidates
    argv2 = [x if x != str(out) else str(tmp_path / "loo2") for x in argv]
    argv2[argv2.index("--loo-size-weights") + 1] = "0.5"
    assert main(argv2) == 0
    joined = tmp_path / "joined"
    assert main(["--benchmark", str(tmp_path / "bench"), "--out", str(joined), "--leave-one-out", "--loo-from",
                 f"{out / 'loo_scores.npz'},{tmp_path / 'loo2' / 'loo_scores.npz'}", "--quiet"]) == 0
    both = json.loads((joined / "loo.json").read_text())
    assert set(both["candidates"]) == set(data["candidates"]) | {"sequential a=0.05 tw=0 sw=0.5", "paper"}
