"""``memforest eval --stream`` (evaluation/stream.py): sessions in date order, every replay
kept within its budget, the offline reference at the stream's final sizes, and each
replay's embedding work charged to it alone (no vectors from another replay's cache)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from eval_fixtures import DAY0, BagOfWordsEmbedder

import memforest_gpu.evaluation.stream_report as stream_report
from memforest_gpu.config import CompressConfig
from memforest_gpu.evaluation import CachedEmbedder, EvalConfig
from memforest_gpu.evaluation.benchmark import write_benchmark
from memforest_gpu.evaluation.dataset import Benchmark, Question
from memforest_gpu.evaluation.stream import StreamConfig, _Timed, run_stream, session_steps

TOPICS = ["garden tomatoes basil", "violin lessons tuesday", "porto bicycle trip", "plum dumplings winter",
          "chess club friday", "marathon training shoes"]


def _bench(tenants=("t0", "t1"), sessions=4, per=6) -> Benchmark:
    """Each tenant: ``sessions`` sessions on consecutive days (listed newest first, so the
    order must come from the dates), ``per`` memories each; one question per session."""
    nodes, qs = [], []
    for t in tenants:
        for s in reversed(range(sessions)):
            for j in range(per):
                topic = TOPICS[(s + j) % len(TOPICS)]
                nodes.append({"id": f"{t}:s{s}:{j}", "text": f"{t} said {topic} note{s}x{j} item{j}",
                              "timestamp": DAY0 + 86400 * s + 60 * j, "tenant": t,
                              "metadata": {"session": f"session_{s + 1}"}})
            qs.append(Question(f"{t}:q{s}", t, f"What about {TOPICS[s % len(TOPICS)]}?", f"note{s}x0",
                               (f"{t}:s{s}:0",), "1"))
    return Benchmark("sessions", nodes, qs)


def test_session_steps_follow_dates():
    b = _bench()
    steps = session_steps(b)
    assert len(steps) == 4
    for k, rows in enumerate(steps):
        assert {b.nodes[i]["metadata"]["session"] for i in rows} == {f"session_{k + 1}"}
        assert sorted(b.nodes[i]["tenant"] for i in rows) == ["t0"] * 6 + ["t1"] * 6
    assert sorted(np.concatenate(steps).tolist()) == list(range(len(b.nodes)))


def test_replay_embedder_charges_each_replay():
    inner = BagOfWordsEmbedder()
    shared = CachedEmbedder(inner, None)
    v = shared.embed(["alpha beta", "gamma"])
    assert inner.calls == 2
    t = _Timed(shared)
    out = t.embed(["alpha beta", "alpha beta", "gamma"])
    assert inner.calls == 4 and (t.texts, t.embedded) == (3, 2)  # the shared cache's vectors are not used
    np.testing.assert_allclose(out.numpy(), v[[0, 0, 1]].numpy(), atol=1e-6)
    t.embed(["gamma"])
    assert inner.calls == 4 and (t.texts, t.embedded) == (4, 2)  # the replay's own cache is
    assert t.name == shared.name and t.dim == shared.dim and t.count_tokens(["a b"]) == [2]
    assert t.seconds > 0


@pytest.fixture(scope="module")
def replay():
    emb = CachedEmbedder(BagOfWordsEmbedder(), None)
    res, work = run_stream(_bench(), ["memforest:matching", "tome", "kmeans_prune"],
                           StreamConfig(budgets=(0.5,), rerun=True), seeds=(0,), embedder=emb,
                           base_config=CompressConfig.preset("memforest"), device="cpu",
                           eval_config=EvalConfig(k=2, max_tokens=40, search_repeats=1))
    return res, work


def test_replays_stay_within_budget_and_offline_matches_the_stream(replay):
    res, work = replay
    labels = set(res.meta["methods"])
    assert labels == {"stream-memforest:matching", "full-memforest:matching", "rerun-memforest:matching",
                      "offline-memforest:matching", "stream-tome", "offline-tome", "stream-kmeans_prune",
                      "offline-kmeans_prune"}
    budget = {"t0": 12, "t1": 12}  # half of each tenant's 24 memories
    final = {}
    for r in work:
        if r["step"] >= 0:
            assert all(n <= budget[t] for t, n in r["sizes"].items()), r
            final[r["method"]] = r["sizes"]
    assert final["stream-memforest:matching"] == final["rerun-memforest:matching"] \
        == final["full-memforest:matching"] == final["stream-tome"] == final["stream-kmeans_prune"]
    nodes = {(r["method"], r["schedule"]): r["value"] for r in res.records if r["metric"] == "nodes"}
    stream_nodes = [v for (m, s), v in nodes.items() if m == "stream-memforest"]
    offline_nodes = [v for (m, s), v in nodes.items() if m == "offline-memforest"]
    assert stream_nodes == offline_nodes == [sum(final["stream-memforest:matching"].values())]


def test_work_records_count_each_replays_texts(replay):
    _, work = replay
    for kind in ("stream", "full", "rerun"):
        steps = [r for r in work if r["method"] == f"{kind}-memforest:matching" and r["step"] >= 0]
        assert sum(r["merges"] for r in steps) > 0
        for r in steps:
            assert r["texts"] == r["merges"]  # one merged text per merge
            assert 0 <= r["embedded"] <= r["texts"]
        first = next(r for r in steps if r["merges"])
        # a replay's first compaction embeds with the model even when an earlier replay embedded
        # the same texts (full and rerun run after stream)
        assert first["embedded"] > 0 and first["embed_seconds"] > 0
    km = [r for r in work if r["method"] == "stream-kmeans_prune"]
    assert sum(r["texts"] for r in km) == 0


def test_cli_stream_outputs(tmp_path, monkeypatch):
    from memforest_gpu.cli.eval import main

    monkeypatch.setattr(stream_report, "SentenceTransformerEmbedder", lambda *a, **k: BagOfWordsEmbedder())
    bench = tmp_path / "bench"
    write_benchmark(_bench(), str(bench))
    out = tmp_path / "out"
    assert main(["--benchmark", str(bench), "--stream", "--rerun", "--budgets", "0.5", "--seeds", "0",
                 "--methods", "memforest:matching,tome", "--out", str(out), "--bootstrap", "50", "--quiet",
                 "--k", "2", "--max-tokens", "40"]) == 0
    md = (out / "stream.md").read_text()
    assert "| texts asked | texts embedded |" in md and "stream-memforest:matching" in md
    assert "offline-memforest:matching" in md and "rerun-memforest:matching | 50%" in md
    data = json.loads((out / "stream.json").read_text())
    assert {r["method"] for r in data["work"]} >= {"stream-memforest:matching", "stream-tome",
                                                   "full-memforest:matching"}
    assert data["meta"]["low_water"] == 0.8
    # --no-full-reference and --low-water reach the replay
    out2 = tmp_path / "out2"
    assert main(["--benchmark", str(bench), "--stream", "--no-full-reference", "--low-water", "0.9", "--budgets", "0.5",
                 "--seeds", "0", "--methods", "memforest:matching", "--out", str(out2), "--bootstrap", "20", "--quiet",
                 "--k", "2", "--max-tokens", "40"]) == 0
    data = json.loads((out2 / "stream.json").read_text())
    assert {r["method"] for r in data["work"]} == {"stream-memforest:matching", "offline-memforest:matching"}
    assert data["meta"]["low_water"] == 0.9
    steps = [r for r in data["work"] if r["step"] >= 0]
    assert all(n <= 12 for r in steps for n in r["sizes"].values())
    assert any(10 in r["sizes"].values() for r in steps if r["merges"])  # floor(0.9 x 12); 0.8 would give 9
