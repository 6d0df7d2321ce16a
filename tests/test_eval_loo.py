"""Leave-one-conversation-out tuning (evaluation/loo.py): selection never sees the held-out
conversation; the end-to-end run picks the configuration that keeps every answer."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from eval_fixtures import BagOfWordsEmbedder, duplicate_facts_benchmark, fact_budget

import memforest_gpu.cli.eval as cli_eval
from memforest_gpu.config import CompressConfig
from memforest_gpu.evaluation import EvalConfig
from memforest_gpu.evaluation.loo import (
    METRICS,
    Candidate,
    CandidateScores,
    candidate_grid,
    leave_one_out,
    loo_markdown,
    preset_choice,
    retention,
    score_candidates,
)


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
    assert c[1].config.partition.alpha == 0.001 and c[1].config.spanning.size_weight == 0.2
    assert c[1].config.merge.schedule == "matching" and c[1].label == "memforest:matching"


def test_end_to_end_picks_the_spanning_kind_that_keeps_every_answer():
    bench = duplicate_facts_benchmark(("t0", "t1", "t2"))
    base = CompressConfig()
    good = Candidate("max-spanning", base)
    bad = Candidate("min-spanning", dataclasses.replace(base, spanning=dataclasses.replace(base.spanning, kind="min")))
    cs = score_candidates(bench, [bad, good, Candidate("tome", base, method="tome")], [0.5], [0, 1],
                          embedder=BagOfWordsEmbedder(), eval_config=EvalConfig(k=2, max_tokens=fact_budget(),
                                                                                search_repeats=1))
    folds = leave_one_out(cs, pool=["min-spanning", "max-spanning"], compare=("min-spanning", "tome"))
    assert [f["held_out"] for f in folds] == ["t0", "t1", "t2"]
    assert all(f["chosen"] == "max-spanning" for f in folds)
    for f in folds:
        assert f["held_out_scores"]["max-spanning"]["B:ansr"]["0.5"] == pytest.approx(1.0)
        assert f["held_out_scores"]["min-spanning"]["B:ansr"]["0.5"] < 1.0
    md = loo_markdown(cs, folds, select="B:ansr_content", compare=("min-spanning", "tome"), choice="max-spanning")
    assert "**max-spanning** (3 of 3 folds)" in md and "| t1 | 4 | max-spanning |" in md
    json.dumps(folds)  # serialisable as written by the CLI


def test_cli_leave_one_out_writes_its_report(tmp_path, monkeypatch, capsys):
    from memforest_gpu.cli.eval import main
    from memforest_gpu.evaluation.benchmark import write_benchmark

    monkeypatch.setattr(cli_eval, "SentenceTransformerEmbedder", lambda *a, **k: BagOfWordsEmbedder())
    write_benchmark(duplicate_facts_benchmark(("t0", "t1", "t2")), str(tmp_path / "bench"))
    out = tmp_path / "loo"
    argv = ["--benchmark", str(tmp_path / "bench"), "--out", str(out), "--leave-one-out", "--ratios", "0.5",
            "--seeds", "0", "--loo-schedules", "sequential", "--loo-alphas", "0.05", "--loo-time-weights", "0",
            "--loo-size-weights", "0,0.2", "--keys", "0", "--text-weight", "1", "-k", "2", "--max-tokens",
            str(fact_budget()), "--quiet"]  # no keys: the candidate of the paper's fields is the paper's config
    assert main(argv) == 0
    data = json.loads((out / "loo.json").read_text())
    assert [f["held_out"] for f in data["folds"]] == ["t0", "t1", "t2"]
    before = "matching a=0.001 tw=0.5/flat sw=0.2 (compare)"  # the preset under the flat rule: compared, never chosen
    assert set(data["candidates"]) == {"sequential a=0.05 tw=0 sw=0", "sequential a=0.05 tw=0 sw=0.2", "tome", before}
    assert data["choice"] in data["candidates"] and data["choice"] != before
    assert data["compare"] == ["sequential a=0.05 tw=0 sw=0", "tome", before]
    assert data["candidates"][before]["config"]["spanning"]["time_rule"] == "flat"
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
    assert both["compare"][-1] == before and all(f["chosen"] != before for f in both["folds"])


def test_candidate_grid_time_rules_in_names_and_once_without_time():
    c = candidate_grid(["matching"], [0.001], [0.0, 0.5], [0.2], time_rules=("scaled", "gated:0.4", "flat"))
    assert [x.name for x in c] == ["matching a=0.001 tw=0 sw=0.2", "matching a=0.001 tw=0.5/scaled sw=0.2",
                                   "matching a=0.001 tw=0.5/gated:0.4 sw=0.2", "matching a=0.001 tw=0.5/flat sw=0.2"]
    assert (c[2].config.spanning.time_rule, c[2].config.spanning.time_min_cos) == ("gated", 0.4)
    assert c[3].config.spanning.time_rule == "flat" and c[1].config.spanning.time_rule == "scaled"
    # time weight 0: the rule does not matter, the base's is kept (so the paper defaults are recognised)
    base = CompressConfig().spanning
    assert (c[0].config.spanning.time_rule, c[0].config.spanning.time_min_cos) == (base.time_rule, base.time_min_cos)


def _shaped_scores() -> CandidateScores:
    """Two shapes of the same 3 conversations: "x" wins on the turns (one question per
    conversation), "y" on the facts (three questions per conversation, so a pooled mean over
    questions would favour the facts)."""
    ten = np.array(["a", "b", "c"] + ["a", "b", "c"] * 3)
    shapes = np.array(["turns"] * 3 + ["facts"] * 9)
    per = {"x": [1.0] * 3 + [0.6] * 9, "y": [0.5] * 3 + [0.9] * 9}
    cands = [Candidate(n, CompressConfig()) for n in per]
    scores = {n: {(0.5, m): np.array([v], dtype=np.float64) for m in METRICS} for n, v in per.items()}
    return CandidateScores(scores, {m: np.ones(len(ten)) for m in METRICS}, ten, [0.5], [0], cands, shapes)


def test_shapes_weigh_the_same_and_folds_report_each_shape(tmp_path):
    from memforest_gpu.evaluation.loo import load_scores, save_scores

    cs = _shaped_scores()
    every = np.ones(12, bool)
    assert retention(cs, "x", every) == pytest.approx(0.8)  # (1.0 + 0.6) / 2, not pooled (0.7)
    assert retention(cs, "y", every) == pytest.approx(0.7)
    assert retention(cs, "y", every, shape="facts") == pytest.approx(0.9)
    folds = leave_one_out(cs, compare=("y",))
    assert all(f["chosen"] == "x" for f in folds) and folds[0]["questions"] == 4
    s = folds[0]["held_out_scores"]["y"]["B:ansr"]
    assert s["mean"] == pytest.approx(0.7) and s["by_shape"]["turns"]["0.5"] == pytest.approx(0.5)
    md = loo_markdown(cs, folds, select="B:ansr_content", compare=("y",), choice="x")
    assert "over the shapes turns and facts" in md and "## Held out, facts (B:ansr_content" in md
    assert "| x | 80.0 | 100.0 | 60.0 |" in md  # all-in, then each shape's all-in
    save_scores(cs, str(tmp_path / "s.npz"))
    back = load_scores([str(tmp_path / "s.npz")])
    assert back.shapes.tolist() == cs.shapes.tolist() and retention(back, "x", every) == pytest.approx(0.8)


def _tiny_locomo(path, tenants=("c0", "c1", "c2")):
    """Conversations of two sessions whose facts restate their turns; one question per fact."""
    data = []
    for t in tenants:
        turns = [("Ann", "my cat is called Miso"), ("Bo", "I bought a red bicycle in Porto"),
                 ("Ann", "violin lessons start on Tuesday"), ("Bo", "grandmother bakes plum dumplings")]
        conv = {"speaker_a": "Ann", "speaker_b": "Bo", "session_1_date_time": "1:56 pm on 8 May, 2023",
                "session_2_date_time": "9:00 am on 9 June, 2023"}
        obs, qa = {}, []
        for s in (1, 2):
            conv[f"session_{s}"] = [{"speaker": sp, "dia_id": f"D{s}:{i + 1}", "text": f"{tx} ({t} {s})"}
                                    for i, (sp, tx) in enumerate(turns)]
            obs[f"session_{s}_observation"] = {sp: [[f"{sp} says {tx}.", f"D{s}:{i + 1}"]]
                                               for i, (sp, tx) in enumerate(turns)}
            qa += [{"question": f"what about {tx}?", "answer": tx.split()[-1], "evidence": [f"D{s}:{i + 1}"],
                    "category": 4} for i, (_, tx) in enumerate(turns)]
        data.append({"sample_id": t, "conversation": conv, "observation": obs, "qa": qa})
    path.write_text(json.dumps(data))


def test_cli_leave_one_out_on_turns_and_facts(tmp_path, monkeypatch):
    from memforest_gpu.cli.eval import main

    monkeypatch.setattr(cli_eval, "SentenceTransformerEmbedder", lambda *a, **k: BagOfWordsEmbedder())
    _tiny_locomo(tmp_path / "tiny.json")
    out = tmp_path / "loo"
    argv = ["--benchmark", str(tmp_path / "tiny.json"), "--nodes", "turns,facts", "--out", str(out),
            "--leave-one-out", "--ratios", "0.5", "--seeds", "0", "--loo-schedules", "matching", "--loo-alphas",
            "0.001", "--loo-time-weights", "0,0.5", "--loo-time-rules", "scaled,flat", "--loo-size-weights", "0.2",
            "--quiet"]
    assert main(argv) == 0
    data = json.loads((out / "loo.json").read_text())
    assert data["shapes"] == ["turns", "facts"] and [f["held_out"] for f in data["folds"]] == ["c0", "c1", "c2"]
    assert set(data["candidates"]) == {"matching a=0.001 tw=0 sw=0.2", "matching a=0.001 tw=0.5/scaled sw=0.2",
                                       "matching a=0.001 tw=0.5/flat sw=0.2", "paper", "tome"}
    assert data["folds"][0]["questions"] == 16  # 8 questions in each shape
    assert set(data["folds"][0]["held_out_scores"]["tome"]["B:ansr"]["by_shape"]) == {"turns", "facts"}
    assert main(argv[:4] + ["--nodes", "turns,facts", "--out", str(tmp_path / "x")]) == 2  # only with LOO
