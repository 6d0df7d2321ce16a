"""M3-Agent memory graphs in their own pickle format: read without importing mmagent,
compressed per node type, written back so that M3-Agent's own class loads them.

``mmagent.videograph`` is M3-Agent's own (the copy in tests/m3_agent, see m3_helpers);
retrieval follows mmagent/retrieve.py (``retrieve_from_videograph``: node scores by
``search_text_nodes(mode="max")``, clip score = max over the clip's nodes). What M3-Agent's
other functions see of a compressed graph: test_m3agent_use.py."""
import pickle
import sys
from collections import defaultdict

import numpy as np
import pytest
from m3_helpers import m3_agent

from memforest_gpu import CompressConfig, MergeConfig
from memforest_gpu.adapters.m3agent import VideoGraph, compress_video_graph, load_video_graph, save_video_graph
from memforest_gpu.engine.quotas import removal_target

FIELDS = ("nodes", "edges", "text_nodes", "text_nodes_by_clip", "event_sequence_by_clip", "max_img_embeddings",
          "max_audio_embeddings", "img_matching_threshold", "audio_matching_threshold", "next_node_id")


@pytest.fixture
def mmagent():
    """M3-Agent's ``mmagent.videograph`` (the copy in tests/m3_agent) for the test, then removed."""
    with m3_agent() as ns:
        yield ns.videograph


def build_video(mod, seed=0, clips=12, per_clip=3, dim=32, ranges=4):
    """A video: ``ranges`` topics over consecutive clip ranges, ``per_clip`` episodic nodes
    and two semantic nodes per clip, 3 faces and 2 voices linked to the text nodes."""
    rng = np.random.default_rng(seed)
    g = mod.VideoGraph()
    faces = [g.add_img_node({"embeddings": rng.standard_normal((2, 8)).tolist(), "contents": [f"face{j}.jpg"]})
             for j in range(3)]
    voices = [g.add_voice_node({"embeddings": rng.standard_normal((1, 8)).tolist(), "contents": [f"asr {j}"]})
              for j in range(2)]
    ents = faces + voices
    g.add_edge(faces[0], voices[0], 1.0)  # face = voice (an equivalence M3-Agent links directly)
    topics = rng.standard_normal((ranges, dim))
    span = clips // ranges
    for c in range(clips):
        topic = topics[c // span]
        for typ, n in (("episodic", per_clip), ("semantic", 2)):
            for i in range(n):
                e = topic + 0.35 * rng.standard_normal(dim)
                who = ents[(c + i) % len(ents)]
                tag = f"face_{who}" if g.nodes[who].type == "img" else f"voice_{who}"
                nid = g.add_text_node({"contents": [f"<{tag}> {typ} event {i} of clip {c} (topic {c // span})."],
                                       "embeddings": [e.tolist()]}, c, typ)
                for j in rng.choice(len(ents), size=int(rng.integers(1, 3)), replace=False):
                    g.add_edge(nid, ents[int(j)], float(rng.integers(1, 4)))
    # a text-text edge across types (allowed by M3-Agent), and a node carrying extra metadata
    g.add_edge(g.text_nodes[0], g.text_nodes[per_clip], 0.5)
    g.nodes[g.text_nodes[1]].metadata["source"] = "gpt-4o"
    return g, topics, span


def _dump(obj, path, protocol=4):
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=protocol)


def _owner(out):
    """input node id -> output node id, from the output's own metadata."""
    own = {}
    for nid, node in out.nodes.items():
        for x in node.metadata.get("merged_from", [nid]) if node.type in ("episodic", "semantic") else [nid]:
            own[x] = nid
    return own


def _compress(tmp_path, mod, ratio=0.5, protocol=4, **kw):
    g, topics, span = build_video(mod, **kw)
    src, dst = tmp_path / "video.pkl", tmp_path / "out.pkl"
    _dump(g, src, protocol)
    res = compress_video_graph(load_video_graph(src), CompressConfig(merge=MergeConfig(ratio=ratio)))
    save_video_graph(res.graph, dst)
    with open(dst, "rb") as f:
        back = pickle.load(f)  # M3-Agent's own loader: plain pickle with mmagent importable
    return g, back, res, topics, span


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
def test_read_without_importing_mmagent(mmagent, tmp_path, protocol):
    g, _, _ = build_video(mmagent)
    p = tmp_path / "video.pkl"
    _dump(g, p, protocol)
    for k in ("mmagent", "mmagent.videograph"):
        sys.modules.pop(k)
    ours = load_video_graph(p)
    assert "mmagent" not in sys.modules and "mmagent.videograph" not in sys.modules
    assert type(ours) is VideoGraph and all(type(n) is VideoGraph.Node for n in ours.nodes.values())
    for key in FIELDS:
        if key == "nodes":
            assert {i: (n.id, n.type, n.embeddings, n.metadata) for i, n in ours.nodes.items()} == \
                   {i: (n.id, n.type, n.embeddings, n.metadata) for i, n in g.nodes.items()}
        else:
            assert getattr(ours, key) == getattr(g, key), key


def test_round_trip_is_loaded_by_m3_agents_class(mmagent, tmp_path):
    g, _, _ = build_video(mmagent)
    p, q = tmp_path / "video.pkl", tmp_path / "same.pkl"
    _dump(g, p)
    save_video_graph(load_video_graph(p), q)
    with open(q, "rb") as f:
        back = pickle.load(f)
    assert type(back) is mmagent.VideoGraph and all(type(n) is mmagent.VideoGraph.Node for n in back.nodes.values())
    assert back.__dict__.keys() == g.__dict__.keys()
    for key in FIELDS[1:]:
        assert getattr(back, key) == getattr(g, key)
    assert {i: n.__dict__ for i, n in back.nodes.items()} == {i: n.__dict__ for i, n in g.nodes.items()}
    # M3-Agent's own methods work on it
    assert back.add_text_node({"contents": ["x"], "embeddings": [[1.0] * 32]}, 99) == g.next_node_id


def test_compress_keeps_every_invariant(mmagent, tmp_path):
    g, out, res, _, _ = _compress(tmp_path, mmagent)
    assert type(out) is mmagent.VideoGraph
    text = {i: n for i, n in g.nodes.items() if n.type in ("episodic", "semantic")}
    # exact removal per node type, merges never across types
    for typ in ("episodic", "semantic"):
        n_in = sum(1 for n in text.values() if n.type == typ)
        n_out = sum(1 for n in out.nodes.values() if n.type == typ)
        assert n_out == n_in - removal_target(n_in, 0.5)
    own = _owner(out)
    assert sorted(own) == sorted(g.nodes)  # every input node is held by exactly one output node
    assert len(set(out.nodes)) == len(out.nodes) and all(i == n.id for i, n in out.nodes.items())
    merged = [n for n in out.nodes.values() if "merged_from" in n.metadata]
    assert merged and len(merged) == len(res.merged)
    for n in merged:
        olds = [g.nodes[x] for x in n.metadata["merged_from"]]
        assert {o.type for o in olds} == {n.type}
        assert n.id in n.metadata["merged_from"]  # keeps one of its members' ids
        assert n.metadata["clip_ids"] == [n.metadata["timestamp"]] == sorted({o.metadata["timestamp"] for o in olds})
        assert len(n.metadata["contents"]) == 1 and n.metadata["contents"][0].strip()
        assert len(n.embeddings) == 1 and len(n.embeddings[0]) == 32
        assert np.linalg.norm(n.embeddings[0]) == pytest.approx(1.0, abs=1e-6)
    assert out.nodes[own[g.text_nodes[1]]].metadata.get("source") == "gpt-4o"  # carried over, merged or not
    # faces, voices and unmerged text nodes untouched
    for i, node in g.nodes.items():
        if node.type in ("img", "voice") or own[i] == i and "merged_from" not in out.nodes[i].metadata:
            assert out.nodes[i].__dict__ == node.__dict__
    # edges: moved to the merged node, weights summed, both directions, no self-loops
    want = defaultdict(float)
    for (a, b), w in g.edges.items():
        if own[a] != own[b]:
            want[(own[a], own[b])] += w
    assert out.edges.keys() == want.keys()
    for k, w in want.items():
        assert out.edges[k] == pytest.approx(w) and out.edges[(k[1], k[0])] == out.edges[k]
    assert all(a != b for a, b in out.edges) and all(a in out.nodes and b in out.nodes for a, b in out.edges)
    for e in (i for i, n in g.nodes.items() if n.type in ("img", "voice")):  # no entity loses a neighbour or weight
        nb_in = {own[b] for (a, b) in g.edges if a == e}
        nb_out = {b for (a, b) in out.edges if a == e}
        assert nb_out == nb_in
        assert sum(w for (a, _), w in out.edges.items() if a == e) == pytest.approx(
            sum(w for (a, b), w in g.edges.items() if a == e and own[b] != own[a]))
    # clip maps: every text node listed under exactly its clips, in the original order
    assert out.text_nodes == list(dict.fromkeys(own[x] for x in g.text_nodes))
    assert sorted(out.text_nodes) == sorted(i for i, n in out.nodes.items() if n.type in ("episodic", "semantic"))
    clips_of = defaultdict(set)
    for c, ids in out.text_nodes_by_clip.items():
        assert len(ids) == len(set(ids))
        for i in ids:
            clips_of[i].add(c)
    for i in out.text_nodes:
        n = out.nodes[i]
        assert clips_of[i] == set(n.metadata.get("clip_ids", [n.metadata["timestamp"]]))
    for c, ids in out.event_sequence_by_clip.items():
        assert ids == list(dict.fromkeys(own[x] for x in g.event_sequence_by_clip[c]))
        assert all(out.nodes[i].type == "episodic" for i in ids)
    # next_node_id still valid: a new node gets a fresh id
    assert out.next_node_id == g.next_node_id and out.next_node_id > max(out.nodes)
    new = out.add_text_node({"contents": ["later"], "embeddings": [[1.0] * 32]}, 12)
    assert new not in g.nodes


def test_compressing_twice_accumulates_provenance(mmagent, tmp_path):
    g, out, _, _, _ = _compress(tmp_path, mmagent, ratio=0.3)
    p = tmp_path / "again.pkl"
    res2 = compress_video_graph(load_video_graph(tmp_path / "out.pkl"), CompressConfig(merge=MergeConfig(ratio=0.3)))
    save_video_graph(res2.graph, p)
    with open(p, "rb") as f:
        out2 = pickle.load(f)
    own = _owner(out2)
    assert sorted(own) == sorted(g.nodes)
    for n in out2.nodes.values():
        if "merged_from" in n.metadata:
            olds = [g.nodes[x] for x in n.metadata["merged_from"]]
            assert n.metadata["clip_ids"] == sorted({o.metadata["timestamp"] for o in olds})


def _retrieve(graph, query, topk=3):
    """mmagent/retrieve.py ``retrieve_from_videograph``: clip score = max over its nodes'
    scores (node clip = metadata['timestamp']); then the memories of the top clips."""
    nodes = graph.search_text_nodes([query], mode="max")
    clip_scores = {}
    for nid, s in nodes:
        c = graph.nodes[nid].metadata["timestamp"]
        clip_scores[c] = max(clip_scores.get(c, -1.0), s)
    top = [c for c, _ in sorted(clip_scores.items(), key=lambda x: x[1], reverse=True)][:topk]
    memories = [graph.nodes[i].metadata["contents"][0] for c in top for i in graph.text_nodes_by_clip[c]]
    return nodes, top, memories


def test_retrieval_still_answers_each_clip_range(mmagent, tmp_path):
    g, out, _, topics, span = _compress(tmp_path, mmagent)
    rng = np.random.default_rng(1)
    for r, topic in enumerate(topics):
        q = (topic + 0.2 * rng.standard_normal(topic.shape)).tolist()
        rng_clips = set(range(r * span, (r + 1) * span))
        for graph in (g, out):
            nodes, top, memories = _retrieve(graph, q)
            best = graph.nodes[nodes[0][0]]
            assert set(best.metadata.get("clip_ids", [best.metadata["timestamp"]])) <= rng_clips
            assert top[0] in rng_clips, (r, top)
            assert any(f"(topic {r})" in m for m in memories)
        # every clip of the range is still reachable: some node listed under it holds its memories
        for c in rng_clips:
            assert any(f"clip {c} " in out.nodes[i].metadata["contents"][0] for i in out.text_nodes_by_clip[c])


class _Evil:
    def __reduce__(self):
        import os

        return (os.system, ("echo pwned",))


def test_other_globals_are_refused(mmagent, tmp_path):
    g, _, _ = build_video(mmagent)
    g.extra = _Evil()
    p = tmp_path / "evil.pkl"
    _dump(g, p)
    with pytest.raises(ValueError, match=r"refusing to load global (posix|os|nt)\.system"):
        load_video_graph(p)
    for obj, name in ((np.float32(1.0), "numpy"), (object(), "builtins.object"), (print, "builtins.print")):
        q = tmp_path / "other.pkl"
        h = mmagent.VideoGraph()
        h.extra = obj
        _dump(h, q)
        if name == "builtins.object":
            with pytest.raises(ValueError, match="reconstruct|object"):
                load_video_graph(q)
        else:
            with pytest.raises(ValueError, match=f"refusing to load global {name}"):
                load_video_graph(q)
    bad = tmp_path / "notgraph.pkl"
    _dump({"nodes": {}}, bad)
    with pytest.raises(ValueError, match="pickle must hold an mmagent.videograph.VideoGraph, got dict"):
        load_video_graph(bad)


def test_getattr_only_reaches_node(mmagent, tmp_path):
    """Protocols 0-3 reach the nested class with builtins.getattr: nothing else through it."""
    class Sneaky:
        def __reduce__(self):
            return (getattr, (mmagent.VideoGraph, "__init__"))

    h = mmagent.VideoGraph()
    h.extra = Sneaky()
    q = tmp_path / "sneaky.pkl"
    _dump(h, q, protocol=2)
    with pytest.raises(ValueError, match="may only use getattr to reach VideoGraph.Node"):
        load_video_graph(q)


def test_cli(mmagent, tmp_path, capsys):
    from memforest_gpu.cli.adapters import main

    g, _, _ = build_video(mmagent)
    src = tmp_path / "video.pkl"
    _dump(g, src)
    dst = tmp_path / "out.pkl"
    assert main(["graph", "compress", str(src), str(dst), "--ratio", "0.5"]) == 0
    text = capsys.readouterr().out
    assert "M3-Agent graph: text nodes 60 -> 30" in text and f"wrote {dst}" in text
    with open(dst, "rb") as f:
        assert type(pickle.load(f)) is mmagent.VideoGraph
    odd = tmp_path / "video.bin"
    odd.write_bytes(src.read_bytes())
    assert main(["graph", "compress", str(odd), str(tmp_path / "o.bin"), "--format", "m3-agent"]) == 0
    assert main(["graph", "compress", str(src), str(tmp_path / "o.jsonl"), "--out-format", "jsonl"]) == 2
    assert "--out-format must be m3-agent" in capsys.readouterr().err
    g.extra = _Evil()
    _dump(g, src)
    assert main(["graph", "compress", str(src), str(dst)]) == 2
    assert "refusing to load global" in capsys.readouterr().err


def test_readme_m3_agent_workflow(mmagent, tmp_path, monkeypatch, capsys):
    """The documented M3-Agent command (docs/adapters.md) runs as written on a graph pickled by
    the stand-in."""
    import re
    from pathlib import Path

    from extras import skip_or_fail

    from memforest_gpu.cli.adapters import main

    readme = (Path(__file__).resolve().parents[1] / "docs" / "adapters.md").read_text()
    m = re.search(r"```bash\n(memforest graph compress video\.pkl .*?)\n```", readme)
    if m is None:
        skip_or_fail("docs/adapters.md's M3-Agent command (memforest graph compress video.pkl ...) no longer matches")
    g, _, _ = build_video(mmagent)
    monkeypatch.chdir(tmp_path)
    _dump(g, tmp_path / "video.pkl")
    argv = m.group(1).split()
    assert main(argv[1:]) == 0
    assert "M3-Agent graph: text nodes 60 -> 30" in capsys.readouterr().out
    with open(tmp_path / argv[4], "rb") as f:
        assert type(pickle.load(f)) is mmagent.VideoGraph
