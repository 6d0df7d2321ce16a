"""Graph memories: text nodes compressed, edges folded so no entity loses a link."""
import json
from collections import defaultdict

import numpy as np
import pytest
import torch

from memforest_gpu import CompressConfig, MergeConfig
from memforest_gpu.adapters.graph import compress_graph, fold_edges, read_graph, write_graph
from memforest_gpu.engine.output import MergeRecord


def synthetic_graph_records(seed=0, videos=2, episodic=60, semantic=16, dim=16):
    """M3-Agent-like graph: per video, episodic + semantic text nodes with clip ids,
    faces and voices, weighted text-entity edges, some text-text and entity-entity edges."""
    rng = np.random.default_rng(seed)
    recs = []
    for v in range(videos):
        ents = [f"v{v}-face{j}" for j in range(4)] + [f"v{v}-voice{j}" for j in range(3)]
        for e in ents:
            kind = "face" if "face" in e else "voice"
            recs.append({"kind": "node", "id": e, "type": kind, "tenant": f"video-{v}",
                         "embedding": rng.standard_normal(8).round(3).tolist(), "metadata": {"track": e}})
        topics = rng.standard_normal((5, dim))
        texts = []
        for typ, n in (("episodic", episodic), ("semantic", semantic)):
            for i in range(n):
                nid = f"v{v}-{typ[:3]}{i}"
                e = topics[rng.integers(5)] + 0.4 * rng.standard_normal(dim)
                recs.append({"kind": "node", "id": nid, "type": typ, "timestamp": int(i // 2),
                             "text": f"<{ents[i % 7]}> does thing {i} in video {v}.",
                             "embedding": e.round(4).tolist(), "tenant": f"video-{v}", "metadata": {"source": "m3"}})
                texts.append(nid)
                for e_id in rng.choice(ents, size=int(rng.integers(1, 4)), replace=False):
                    recs.append({"kind": "edge", "source": nid, "target": str(e_id),
                                 "weight": float(rng.integers(1, 5)) / 4})
        for _ in range(10):  # text-text links
            a, b = rng.choice(texts, size=2, replace=False)
            recs.append({"kind": "edge", "source": str(a), "target": str(b), "weight": 0.5})
        recs.append({"kind": "edge", "source": ents[0], "target": ents[4], "weight": 1.0})  # face = voice
    return recs


@pytest.fixture
def graph_file(tmp_path):
    p = tmp_path / "g.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in synthetic_graph_records()))
    return p


def _owner(graph):
    """original id -> output node id, from the output's sources (independent of the merge log)."""
    own = {}
    for i, src in zip(graph.texts.ids, graph.texts.sources):
        for s in src:
            own[s] = i
    for e in graph.entities:
        own[e["id"]] = e["id"]
    return own


def test_compress_folds_edges(graph_file):
    g = read_graph(graph_file)
    assert len(g.texts) == 2 * 76 and len(g.entities) == 14
    res = compress_graph(g, CompressConfig(merge=MergeConfig(ratio=0.5)))
    out = res.graph
    # exact per (video, type) removal; entities untouched
    for v in range(2):
        for typ, n in (("episodic", 60), ("semantic", 16)):
            kept = sum(1 for t, ty in zip(out.texts.tenants, out.types) if t == f"video-{v}" and ty == typ)
            assert kept == n - round(0.5 * n)
    assert out.entities == g.entities
    # merges never cross a video or a node type
    kind = dict(zip(g.texts.ids, zip(g.texts.tenants, g.types)))
    for src in out.texts.sources:
        assert len({kind[s] for s in src}) == 1
    # expected edges: map every endpoint to the node that holds it now, sum, drop internal ones
    own = _owner(out)
    want = defaultdict(float)
    internal = 0
    for s, t, w in zip(g.source, g.target, g.weight):
        if own[s] == own[t]:
            internal += 1
            continue
        want[(own[s], own[t])] += w
    got = {(s, t): w for s, t, w in zip(out.source, out.target, out.weight)}
    assert set(got) == set(want)
    for key, w in want.items():
        assert got[key] == pytest.approx(w, abs=1e-12)
    assert res.internal_edges == internal and len(got) == len(out.source)  # no duplicate (source, target)
    # no entity loses a link, and its total weight is kept
    for e in g.entities:
        before = sum(w for s, t, w in zip(g.source, g.target, g.weight) if e["id"] in (s, t))
        after = sum(w for s, t, w in zip(out.source, out.target, out.weight) if e["id"] in (s, t))
        nb_before = {own[t if s == e["id"] else s] for s, t in zip(g.source, g.target) if e["id"] in (s, t)}
        nb_after = {t if s == e["id"] else s for s, t in zip(out.source, out.target) if e["id"] in (s, t)}
        assert nb_after == nb_before and after == pytest.approx(before), e["id"]
    # merged nodes record their originals and every clip id inside them
    clip = dict(zip(g.texts.ids, g.texts.timestamps.tolist()))
    for src, meta, ts in zip(out.texts.sources, out.texts.metadata, out.texts.timestamps.tolist()):
        if len(src) > 1:
            assert sorted(meta["merged_from"]) == sorted(src)
            assert meta["clip_ids"] == sorted({int(clip[s]) for s in src})
            assert ts == max(clip[s] for s in src)


def test_fold_edges_replays_the_log_in_order():
    merges = [MergeRecord(1, "t", "x", "y", 1.0, "xy"), MergeRecord(2, "t", "xy", "z", 1.0, "xyz")]
    s, t, w, internal = fold_edges(["x", "y", "z", "face", "x", "q"], ["face", "face", "voice", "x", "y", "z"],
                                   np.array([1.0, 2.0, 0.5, 4.0, 9.0, 1.5]), merges)
    assert list(zip(s, t, w.tolist())) == [("xyz", "face", 3.0), ("xyz", "voice", 0.5), ("face", "xyz", 4.0),
                                           ("q", "xyz", 1.5)]
    assert internal == 1


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_round_trip(graph_file, tmp_path, suffix):
    g = read_graph(graph_file)
    res = compress_graph(g, CompressConfig(merge=MergeConfig(ratio=0.3)))
    p = tmp_path / f"out.{suffix}"
    write_graph(res.graph, p)
    back = read_graph(p)
    a, b = res.graph, back
    assert a.texts.ids == b.texts.ids and a.texts.texts == b.texts.texts and a.types == b.types
    assert a.texts.sources == b.texts.sources and a.texts.metadata == b.texts.metadata
    assert torch.equal(a.texts.embeddings, b.texts.embeddings)
    assert torch.equal(a.texts.timestamps, b.texts.timestamps)
    assert a.source == b.source and a.target == b.target and np.array_equal(a.weight, b.weight)
    assert [e["id"] for e in a.entities] == [e["id"] for e in b.entities]
    if suffix == "jsonl":
        assert a.entities == b.entities
    # a compressed graph compresses again, provenance accumulating
    again = compress_graph(back, CompressConfig(merge=MergeConfig(ratio=0.3)))
    assert sorted(s for src in again.graph.texts.sources for s in src) == sorted(g.texts.ids)


def test_bad_files(tmp_path):
    def write(recs):
        p = tmp_path / "bad.jsonl"
        p.write_text("".join(json.dumps(r) + "\n" for r in recs))
        return p

    node = {"kind": "node", "id": "a", "text": "hi", "timestamp": 1, "embedding": [1.0, 0.0]}
    with pytest.raises(ValueError, match="edge endpoints must be node ids, got edge 'a' -> 'ghost' with unknown"):
        read_graph(write([node, {"kind": "edge", "source": "a", "target": "ghost"}]))
    with pytest.raises(ValueError, match=r"kind must be one of \['node', 'edge'\], got 'vertex'"):
        read_graph(write([{**node, "kind": "vertex"}]))
    with pytest.raises(ValueError, match=r"fields of a node must be among .* got unknown \['colour'\]"):
        read_graph(write([{**node, "colour": "red"}]))
    with pytest.raises(ValueError, match="edge weight must be a finite number"):
        read_graph(write([node, {"kind": "edge", "source": "a", "target": "a", "weight": "heavy"}]))
    with pytest.raises(ValueError, match="node ids must be unique, got duplicate id 'a'"):
        read_graph(write([node, {"kind": "node", "id": "a", "type": "face"}]))


def test_cli(graph_file, tmp_path, capsys):
    from memforest_gpu.cli.adapters import main

    out = tmp_path / "small.parquet"
    assert main(["graph", "compress", str(graph_file), str(out), "--ratio", "0.5", "--embedder", "none"]) == 0
    g = read_graph(out)
    assert len(g.texts) == 76
    text = capsys.readouterr().out
    assert "edges" in text and "wrote" in text
