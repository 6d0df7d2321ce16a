"""StreamMeCo, the pruning baseline for graph memories (adapters/streammeco.py): its two branches,
exact removal, and the contract every graph method meets on M3-Agent's own graphs (ratio
reached per node type, identity lines kept, clip cutoffs honoured), on our graph files, and in
the evaluation harness where a benchmark's nodes name their entities."""
from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch
from m3_helpers import m3_agent
from test_graph import synthetic_graph_records

from memforest_gpu import CompressConfig
from memforest_gpu.adapters.graph import compress_graph, read_graph
from memforest_gpu.adapters.m3_streammeco import compress_video, prune_video_graph
from memforest_gpu.adapters.m3agent import load_video_graph, save_video_graph
from memforest_gpu.adapters.streammeco import StreamMeCoConfig, _farthest_first, streammeco_keep
from memforest_gpu.config import MergeConfig
from memforest_gpu.engine.quotas import removal_target


def _unit(x):
    return torch.nn.functional.normalize(torch.as_tensor(np.asarray(x, dtype=np.float32)), dim=1)


def test_farthest_first_picks_the_centre_then_spreads():
    E = _unit([[1, 0], [0.99, 0.14], [0, 1], [0.7, 0.7], [-1, 0.05]])
    assert _farthest_first(E, _unit([[1, 0]])[0], 3) == [0, 4, 2]  # centre-nearest, then max-min distance
    assert _farthest_first(E, E[0], 9) == [0, 1, 2, 3, 4] and _farthest_first(E, E[0], 0) == []


def test_linked_branch_keeps_important_and_distinct_nodes():
    # four linked nodes: two near-duplicates, one distinct, one distinct with heavy entity links
    E = _unit([[1, 0, 0], [1, 0.01, 0], [0, 1, 0], [0, 0, 1]])
    scope, group = np.zeros(4, dtype=np.int64), None
    keep, short = streammeco_keep(E, scope, np.array([1.0, 1.0, 1.0, 5.0]), np.ones(4, bool), group,
                                  np.zeros(4, bool), ratio=0.5)
    assert keep.tolist() == [False, False, True, True] and short == {0: 0}  # the redundant pair goes
    # importance alone (alpha 1): the heaviest links stay
    keep, _ = streammeco_keep(E, scope, np.array([3.0, 1.0, 2.0, 0.5]), np.ones(4, bool), group, np.zeros(4, bool),
                              ratio=0.5, config=StreamMeCoConfig(alpha=1.0))
    assert keep.tolist() == [True, False, True, False]


def test_exact_removal_per_scope_protected_kept_and_one_node_per_group():
    rng = np.random.default_rng(0)
    N = 60
    E = _unit(rng.standard_normal((N, 8)))
    scope = np.repeat([0, 1], 30)
    linked = rng.random(N) < 0.5
    importance = np.where(linked, rng.integers(1, 4, N), 0).astype(float)
    protected = np.zeros(N, bool)
    protected[[3, 40]] = True
    group = np.tile(np.arange(6), 10)  # six sampling groups (clips) per scope
    for ratio in (0.3, 0.5, 0.7, 0.9):
        keep, short = streammeco_keep(E, scope, importance, linked, group, protected, ratio=ratio, seed=1)
        assert keep[protected].all()
        for s in (0, 1):
            cand = (scope == s) & ~protected
            assert (~keep[cand]).sum() == removal_target(int(cand.sum()), ratio) - short[s]
            for g in range(6):
                assert keep[(scope == s) & (group == g)].any(), (ratio, s, g)
        assert sum(short.values()) == 0 or ratio == 0.9  # at 0.9 some groups are down to their last node
        again, _ = streammeco_keep(E, scope, importance, linked, group, protected, ratio=ratio, seed=1)
        assert np.array_equal(keep, again)  # deterministic


def test_graph_file_cli(tmp_path, capsys):
    from memforest_gpu.cli.adapters import main

    src = tmp_path / "g.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in synthetic_graph_records()))
    out = tmp_path / "small.jsonl"
    assert main(["graph", "compress", str(src), str(out), "--method", "streammeco", "--ratio", "0.5",
                 "--embedder", "none"]) == 0
    assert "of removed nodes dropped); entities unchanged: 14" in capsys.readouterr().out
    g, h = read_graph(src), read_graph(out)
    for v in range(2):
        for typ, n in (("episodic", 60), ("semantic", 16)):
            kept = sum(1 for t, ty in zip(h.texts.tenants, h.types) if t == f"video-{v}" and ty == typ)
            assert kept == n - round(0.5 * n)
    assert h.entities == g.entities
    orig = dict(zip(g.texts.ids, g.texts.texts))
    assert all(orig[i] == t for i, t in zip(h.texts.ids, h.texts.texts))  # pruned, never rewritten
    alive = set(h.texts.ids) | {e["id"] for e in h.entities}
    want = [(s, t, w) for s, t, w in zip(g.source, g.target, g.weight.tolist()) if s in alive and t in alive]
    assert list(zip(h.source, h.target, h.weight.tolist())) == want
    res = compress_graph(g, CompressConfig(merge=MergeConfig(ratio=0.5)), method="streammeco")
    assert res.report.tenants[0]["tenant"] in {"video-0/episodic", "video-0/semantic"}
    with pytest.raises(ValueError, match=r"method must be one of \['memforest', 'streammeco'\], got 'x'"):
        compress_graph(g, None, method="x")


@pytest.fixture(scope="module")
def m3():
    with m3_agent(dim=64) as ns:
        yield ns


def _prune(m3, g, tmp_path, ratio):
    src, dst = tmp_path / "in.pkl", tmp_path / "out.pkl"
    with open(src, "wb") as f:
        pickle.dump(g, f)
    res = prune_video_graph(load_video_graph(src), CompressConfig(merge=MergeConfig(ratio=ratio)))
    save_video_graph(res.graph, dst)
    with open(dst, "rb") as f:
        out = pickle.load(f)  # M3-Agent's own class loads it
    assert type(out) is m3.videograph.VideoGraph
    return out, res


@pytest.mark.parametrize("ratio", [0.3, 0.7])
def test_m3_agent_contract(m3, tmp_path, ratio):
    """Ratio reached per node type, identity lines kept as they were, clip cutoffs honoured:
    at every clip the pruned graph truncated there holds exactly the uncompressed one's memories
    minus the pruned ones, nothing of a later clip, and search hides only what was pruned."""
    g = m3.build.build_video(24)
    out, res = _prune(m3, g, tmp_path, ratio)
    text = {i: n for i, n in g.nodes.items() if n.type in ("episodic", "semantic")}
    identity = {i for i, n in text.items() if n.metadata["contents"][0].startswith("Equivalence")}
    for typ in ("episodic", "semantic"):
        n_in = sum(1 for i, n in text.items() if n.type == typ and i not in identity)
        n_kept = sum(1 for i, n in out.nodes.items() if n.type == typ and i not in identity)
        assert n_in - n_kept == removal_target(n_in, ratio)
    assert res.report.shortfall == 0 and res.report.kept == len(identity)
    for i in identity:  # as they were: same node, same edges
        assert out.nodes[i].__dict__ == g.nodes[i].__dict__
        assert {e: w for e, w in out.edges.items() if i in e} == {e: w for e, w in g.edges.items() if i in e}
    for i, n in out.nodes.items():  # nothing rewritten
        assert n.__dict__ == g.nodes[i].__dict__
    pruned = set(text) - set(out.nodes)
    assert not any(a in pruned or b in pruned for a, b in out.edges)
    rep = m3.check.check(g, out, queries=[g.nodes[g.text_nodes[7]].metadata["contents"][0]], before_clips=[5, 17])
    assert rep["characters"][0] == rep["characters"][1] and rep["characters_pruned"][0] == rep["characters_pruned"][1]
    assert rep["search"] == {"dropped": [], "raw_ids": [], "equivalence_text": [], "after_cutoff": []}
    clip_of = {i: n.metadata["timestamp"] for i, n in text.items()}
    for r in rep["cutoffs"]:
        gone = sum(1 for i in pruned if clip_of[i] <= r["clip"])
        assert r["leaked"] == r["listed_but_deleted"] == r["leaked_search"] == 0, r
        assert r["deleted"] == r["hidden_memwise"] == r["hidden_clipwise"] == gone, r
        assert r["compressed"] == r["uncompressed"] - gone and r["characters_equal"], r
    for ids in out.text_nodes_by_clip.values():  # every clip keeps a text node: M3-Agent can cut there
        assert ids and all(i in out.nodes for i in ids)


def test_m3_agent_cli_and_dispatch(m3, tmp_path, capsys):
    from memforest_gpu.cli.adapters import main

    g = m3.build.build_video(6)
    src, dst = tmp_path / "video.pkl", tmp_path / "out.pkl"
    with open(src, "wb") as f:
        pickle.dump(g, f)
    assert main(["graph", "compress", str(src), str(dst), "--method", "streammeco", "--ratio", "0.5", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "removed by StreamMeCo" in text and "schedule streammeco" in text
    with open(dst, "rb") as f:
        assert m3.check.characters(pickle.load(f)) == m3.check.characters(g)
    with pytest.raises(ValueError, match=r"method must be one of \['memforest', 'streammeco'\], got 'tome'"):
        compress_video(load_video_graph(src), method="tome")


def test_harness_runs_streammeco_where_nodes_name_entities(tmp_path):
    from eval_fixtures import BagOfWordsEmbedder, duplicate_facts_benchmark

    from memforest_gpu.evaluation import EvalConfig, run_grid
    from memforest_gpu.evaluation.benchmark import write_benchmark
    from memforest_gpu.evaluation.methods import compress_with

    bench = duplicate_facts_benchmark()
    with pytest.raises(ValueError, match="streammeco needs entity links: node metadata 'entities'"):
        compress_with("streammeco", bench.store(BagOfWordsEmbedder()), CompressConfig())
    for j, n in enumerate(bench.nodes):
        if j % 2 == 0:
            n["metadata"] = {"entities": {"alice": 1.0 + j % 3}}
    assert bench.has_entity_links()
    res = run_grid(bench, ["streammeco", "tome"], [0.5], [0], embedder=BagOfWordsEmbedder(),
                   eval_config=EvalConfig(k=2, search_repeats=1))
    reached = [r["value"] for r in res.records if r["method"] == "streammeco" and r["metric"] == "ratio_reached"]
    assert reached == [0.5]
    # `memforest eval --methods default` adds it for such a benchmark
    from memforest_gpu.cli.eval import main

    write_benchmark(bench, str(tmp_path / "b"))
    out = tmp_path / "out"
    assert main(["--benchmark", str(tmp_path / "b"), "--ratios", "0.5", "--seeds", "0", "-k", "2", "--bootstrap",
                 "20", "--out", str(out), "--quiet", "--embedder", "default"]) == 0
    assert "streammeco" in json.loads((out / "results.json").read_text())["meta"]["methods"]
