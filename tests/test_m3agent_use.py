"""M3-Agent can still use a compressed graph (issue 21). Graphs are built clip by clip by
M3-Agent's own code (tests/m3_agent: VideoGraph, process_memories, refresh_equivalences),
compressed, and used by M3-Agent's own functions: refresh_equivalences,
truncate_memory_by_clip, prune_memory_by_node_type, search (with and without before_clip)
and translate. Three things must not change for M3-Agent:

1. who is who: the ``Equivalence:`` lines are never merged, so the characters are the same;
2. search output: every merged memory comes out of translate as text with
   ``<character_N>`` names, never dropped, never raw ids or an Equivalence line inside;
3. clip cutoffs: at every clip c the compressed graph truncated at c holds every memory the
   uncompressed one holds (possibly merged) and nothing of a later clip; ``search(...,
   before_clip=c)`` hides nothing and leaks nothing.
"""
import dataclasses
import pickle

import pytest
from m3_helpers import m3_agent, m3_report, run_m3

from memforest_gpu import CompressConfig
from memforest_gpu.adapters.m3agent import compress_video_graph, load_video_graph, save_video_graph
from memforest_gpu.config import MergeConfig

PRESET = CompressConfig.preset("memforest")
#: every source's vector kept as a key (the lossless option, --keys all): what the vector bounds are about
KEYED = dataclasses.replace(PRESET, merge=dataclasses.replace(PRESET.merge, keys=-1))


@pytest.fixture(scope="module")
def m3():
    with m3_agent(dim=64) as ns:  # the structure is what matters here; full sizes: test_m3_agent_process
        yield ns


def _compress(m3, g, tmp_path, config=None, name="out.pkl", vectors="auto"):
    """g pickled by M3-Agent, compressed, and loaded back by M3-Agent's pickle.load."""
    src, dst = tmp_path / "in.pkl", tmp_path / name
    with open(src, "wb") as f:
        pickle.dump(g, f)
    res = compress_video_graph(load_video_graph(src), config, vectors=vectors)
    save_video_graph(res.graph, dst)
    with open(dst, "rb") as f:
        out = pickle.load(f)
    assert type(out) is m3.videograph.VideoGraph
    return out, res


@pytest.fixture(scope="module")
def video(m3, tmp_path_factory):
    """The 24-clip video, compressed with the command line's default preset at ratio 0.5."""
    g = m3.build.build_video(24)
    out, res = _compress(m3, g, tmp_path_factory.mktemp("video"), CompressConfig.preset("memforest"))
    return g, out, res


def test_identity_lines_are_never_merged_smallest_case(m3, tmp_path):
    """Two faces, two voices, their two Equivalence lines and one fact each, ratio 0.5: the
    Equivalence lines (nearly identical vectors) used to merge and join the two people."""
    g = m3.build.build_small()
    assert m3.check.characters(g) == [["face_0", "voice_1"], ["face_2", "voice_3"]]
    for cfg in (None, CompressConfig.preset("memforest")):
        out, res = _compress(m3, g, tmp_path, cfg)
        assert m3.check.characters(out) == [["face_0", "voice_1"], ["face_2", "voice_3"]]
        eq = [i for i, n in g.nodes.items() if n.metadata.get("contents", [""])[0].startswith("Equivalence")]
        for i in eq:  # as they were: same node, same edges (its vector repeated when merged nodes hold keys)
            a, b = dict(out.nodes[i].__dict__), dict(g.nodes[i].__dict__)
            assert all(e == b["embeddings"][0] for e in a.pop("embeddings")) and b.pop("embeddings")
            assert a == b
            assert {e: w for e, w in out.edges.items() if i in e} == {e: w for e, w in g.edges.items() if i in e}
        assert res.report.kept == 2 and res.info["text_out"] == 3  # the two facts merged: round(0.5 * 2) = 1


def test_characters_survive_refresh_truncate_and_prune(m3, video):
    g, out, _ = video
    rep = m3.check.check(g, out, queries=[], before_clips=[])
    assert len(rep["characters"][0]) == 4
    assert rep["characters"][1] == rep["characters"][0]
    assert rep["characters_pruned"][1] == rep["characters_pruned"][0]
    assert all(r["characters_equal"] for r in rep["cutoffs"]), [r["clip"] for r in rep["cutoffs"]
                                                               if not r["characters_equal"]]


def test_search_and_translate_give_every_merged_memory_as_text(m3, video):
    g, out, _ = video
    m3.check.characters(out)
    merged = [n for n in out.nodes.values() if len(n.metadata.get("merged_from", [])) > 1]
    assert len(merged) > 50
    for n in merged:
        text = m3.retrieve.translate(out, n.metadata["contents"])
        assert len(text) == 1 and not m3.check.RAW.search(text[0]) and "equivalence" not in text[0].lower()
        assert "<character_" in text[0] or "<" not in text[0]
    clips = sorted(g.text_nodes_by_clip)
    rep = m3.check.search_problems(out, [g.nodes[i].metadata["contents"][0] for i in g.text_nodes[::40]]
                                   + ["Who is the owner of the laptop?"], clips[::6])
    assert rep == {"dropped": [], "raw_ids": [], "equivalence_text": [], "after_cutoff": []}
    # clip-wise search: one memory per node listed under the clip, Equivalence lines left out as before
    m3.check.characters(g)
    for c in clips[::5]:
        mems, _, _ = m3.retrieve.search(out, f"CLIP_{c}", [], topk=len(clips), before_clip=c)
        for key, ms in mems.items():
            k = int(key.split("_")[1])
            assert k <= c
            listed = [out.nodes[i].metadata["contents"][0] for i in out.text_nodes_by_clip[k]]
            assert len(ms) == sum(not t.lower().startswith("equivalence: ") for t in listed)


def test_clip_cutoffs_lose_hide_and_leak_nothing(m3, video):
    g, out, _ = video
    clip_of = {i: n.metadata["timestamp"] for i, n in g.nodes.items() if n.type in m3.check.TEXT}
    for n in out.nodes.values():  # a merged node holds one clip, and is listed under it only
        if n.type in m3.check.TEXT:
            assert {clip_of[x] for x in n.metadata.get("merged_from", [n.id])} == {n.metadata["timestamp"]}
    for c, ids in out.text_nodes_by_clip.items():
        assert all(out.nodes[i].metadata["timestamp"] == c for i in ids)
    rep = m3.check.check(g, out, queries=[], before_clips=[])
    assert len(rep["cutoffs"]) == 24
    for r in rep["cutoffs"]:
        assert r["compressed"] == r["uncompressed"] and r["nodes"] < r["uncompressed"], r
        assert all(r[k] == 0 for k in m3.check.CUTOFF_COUNTS), r


@pytest.mark.parametrize("preset", ["paper", "memforest"])
def test_m3_agent_rules_hold_for_every_preset_and_ratio(m3, tmp_path, preset):
    g = m3.build.build_video(12, seed=3)
    for ratio in (0.3, 0.7):
        cfg = CompressConfig.preset(preset)
        cfg = CompressConfig(partition=cfg.partition, spanning=cfg.spanning, merge=MergeConfig(
            ratio=ratio, schedule=cfg.merge.schedule))
        out, res = _compress(m3, g, tmp_path, cfg)
        rep = m3.check.check(g, out, queries=[g.nodes[g.text_nodes[7]].metadata["contents"][0]], before_clips=[5])
        assert rep["failures"] == [], rep["failures"][:5]
        assert res.report.kept == sum(1 for n in g.nodes.values()
                                      if n.type == "semantic" and n.metadata["contents"][0].startswith("Equivalence"))


def test_keep_pattern_and_merge_within(m3, tmp_path):
    from memforest_gpu.adapters.graph import GRAPH_KEEP_PATTERN
    from memforest_gpu.adapters.m3agent import m3_config

    g = m3.build.build_video(6)
    kept = [i for i, n in g.nodes.items() if n.type == "semantic" and "friends" in n.metadata["contents"][0]]
    cfg = CompressConfig(merge=MergeConfig(keep_pattern=GRAPH_KEEP_PATTERN + "|friends"))
    out, res = _compress(m3, g, tmp_path, cfg)
    assert kept and all(out.nodes[i].__dict__ == g.nodes[i].__dict__ for i in kept)
    assert m3.check.characters(out) == m3.check.characters(g)
    assert m3_config(None).merge.keep_pattern == GRAPH_KEEP_PATTERN
    assert m3_config(None).merge.merge_within == "timestamp"
    with pytest.raises(ValueError, match="merge_within must be 'timestamp' \\(the clip\\) for an M3-Agent graph, "
                                         "got 'scene'"):
        compress_video_graph(g, CompressConfig(merge=MergeConfig(merge_within="scene")))


def test_cli_reports_kept_nodes_and_shortfall(m3, tmp_path, capsys):
    from memforest_gpu.cli import main

    g = m3.build.build_video(6)
    src, dst = tmp_path / "video.pkl", tmp_path / "out.pkl"
    with open(src, "wb") as f:
        pickle.dump(g, f)
    assert main(["graph", "compress", str(src), str(dst), "--quiet"]) == 0
    text = capsys.readouterr().out
    n_eq = sum(1 for n in g.nodes.values() if n.type == "semantic" and n.metadata["contents"][0].startswith("Equ"))
    assert f"kept: {n_eq} nodes match the keep rule" in text
    assert f"{n_eq} kept (keep rule)" in text
    with open(dst, "rb") as f:
        assert m3.check.characters(pickle.load(f)) == m3.check.characters(g)


def test_m3_agent_process_uses_the_output(tmp_path, capsys):
    """The issue's setting end to end: M3-Agent's code builds a 24-clip video in a process of
    its own (text vectors 3072-d, faces 512-d, voices 192-d), ``memforest graph compress``
    with the defaults, then M3-Agent's code, in a process that never imports memforest, uses
    both graphs and finds nothing changed (check.py)."""
    from memforest_gpu.cli import main

    src, dst = tmp_path / "video.pkl", tmp_path / "video.small.pkl"
    p = run_m3("build.py", src)
    assert p.returncode == 0, p.stderr
    assert "episodic 332, semantic 45, faces 4, voices 4" in p.stdout
    assert main(["graph", "compress", str(src), str(dst), "--quiet"]) == 0
    assert "M3-Agent graph: text nodes 377 -> " in capsys.readouterr().out
    rep = m3_report(src, dst)
    assert rep["memforest_imported"] == [] and rep["failures"] == []
    assert len(rep["characters"][0]) == 4 and rep["text_nodes"][1] < 0.6 * rep["text_nodes"][0]


# ----------------------------------------------------------------------------- vectors per text node
TEXT = ("episodic", "semantic")


def _text_nodes(g):
    return [n for n in g.nodes.values() if n.type in TEXT]


def _vectors(g) -> int:
    return sum(len(n.embeddings) for n in _text_nodes(g))


def check_vectors_and_key_sources(out, bound=None):
    """Every text node of ``out`` holds the same number of vectors (at most ``bound``), M3-Agent's
    own search_text_nodes stacks and scores them all, and a node's key_sources list each of its
    sources exactly once (only its own), one list per vector after its text's; a shorter list is
    padded with its last vector. Returns the count per node."""
    text = _text_nodes(out)
    counts = {len(n.embeddings) for n in text}
    assert len(counts) == 1, sorted(counts)
    e = counts.pop()
    assert bound is None or e <= bound
    for n in text:
        ks = n.metadata.get("key_sources")
        held = n.metadata.get("merged_from", [n.id])
        if ks is None:
            assert all(v == n.embeddings[0] for v in n.embeddings[1:]) or "merged_from" not in n.metadata
            continue
        flat = [x for k in ks for x in k]
        assert len(flat) == len(set(flat)) and sorted(flat) == sorted(held), (n.id, ks, held)
        assert all(k for k in ks) and 1 + len(ks) <= e
        assert all(v == n.embeddings[len(ks)] for v in n.embeddings[1 + len(ks):])  # padding: the last vector
    q = text[0].embeddings[0]
    hits = out.search_text_nodes([q], mode="max")  # np.array over every node: fails on ragged lists
    assert len(hits) == len(out.text_nodes) and hits[0][1] == pytest.approx(1.0)
    return e


@pytest.mark.parametrize("ratio", [0.5, 0.7])
def test_compressed_graph_holds_no_more_vectors_than_its_input(m3, tmp_path, ratio):
    """The default preset keeps every source as a key; a graph M3-Agent's code built (one vector
    per text node) used to come out with every text node padded to the longest list (9 vectors
    each at 0.5 on its 377-node video): now to the bound input vectors // output text nodes."""
    g = m3.build.build_video(24)
    cfg = KEYED
    assert cfg.merge.keys != 0
    cfg = CompressConfig(partition=cfg.partition, spanning=cfg.spanning,
                         merge=dataclasses.replace(cfg.merge, ratio=ratio))
    out, res = _compress(m3, g, tmp_path, cfg)
    n_in, n_out = len(_text_nodes(g)), len(_text_nodes(out))
    assert _vectors(g) == n_in > 300
    bound = max(1, n_in // n_out)
    e = check_vectors_and_key_sources(out, bound)
    assert _vectors(out) == e * n_out <= _vectors(g)
    assert res.info["text_vectors_in"] == n_in and res.info["text_vectors_out"] == _vectors(out)
    assert res.info["vector_bound"] == bound and res.info["vectors_per_node"] == e
    if bound > 1:  # room for keys: merged nodes hold their text vector and one or more centres of their sources
        assert e == bound and any(n.metadata.get("key_sources") for n in _text_nodes(out))
    else:
        assert all("key_sources" not in n.metadata for n in _text_nodes(out))
    unbounded, _ = _compress(m3, g, tmp_path, cfg, vectors="all", name="all.pkl")  # what it was before
    assert _vectors(unbounded) > _vectors(g)


@pytest.mark.parametrize("bound", [1, 2, 3, 6])
def test_a_bound_given_is_honoured(m3, tmp_path, bound):
    g = m3.build.build_video(12, seed=3)
    out, res = _compress(m3, g, tmp_path, KEYED, vectors=bound)
    e = check_vectors_and_key_sources(out, bound)
    assert res.info["vector_bound"] == bound and e == min(bound, 1 + max(
        len(n.metadata.get("merged_from", [])) for n in _text_nodes(out)))
    keyed = [n for n in _text_nodes(out) if n.metadata.get("key_sources")]
    assert bool(keyed) == (bound > 1)
    most = max(len(n.metadata.get("merged_from", [n.id])) for n in _text_nodes(out))
    assert most >= 4
    for n in keyed:  # a node of more sources than bound - 1 holds centres standing for several, else them all
        ks = n.metadata["key_sources"]
        assert len(ks) == min(bound - 1, len(n.metadata["merged_from"]))
        assert any(len(k) > 1 for k in ks) == (len(n.metadata["merged_from"]) > bound - 1)


def test_compressing_a_bounded_graph_again(m3, tmp_path):
    """A compressed graph (keys read back from embeddings[1:] and key_sources) compresses again
    under any bound, each source still in exactly one key; M3-Agent's characters stay."""
    g = m3.build.build_video(12, seed=3)
    cfg = KEYED
    for first, second in ((3, "auto"), (1, 3), ("all", 2), (4, "auto")):
        once, _ = _compress(m3, g, tmp_path, cfg, vectors=first, name="once.pkl")
        twice, res = _compress(m3, once, tmp_path, cfg, vectors=second, name="twice.pkl")
        check_vectors_and_key_sources(twice, None if second == "auto" else second)
        if second == "auto":
            assert _vectors(twice) <= _vectors(once)
        held = sorted(x for n in _text_nodes(twice) for x in n.metadata.get("merged_from", [n.id]))
        assert held == sorted(n.id for n in _text_nodes(g))
        assert m3.check.characters(twice) == m3.check.characters(g)


def test_bound_keys_makes_centres_of_a_nodes_keys():
    import numpy as np

    from memforest_gpu.adapters.m3_keys import bound_keys, fit_node, vector_bound

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(8), rng.standard_normal(8)
    keys = np.stack([a, a + 0.01, b, b + 0.02, a - 0.01])
    keys /= np.linalg.norm(keys, axis=1, keepdims=True)
    srcs = [["1"], ["2", "3"], ["4"], ["5"], ["6"]]
    vec, ks = bound_keys(keys, srcs, 2)
    assert ks == [["1", "2", "3", "6"], ["4", "5"]]  # near a, near b; a centre lists its keys' sources in order
    assert np.allclose(np.linalg.norm(vec, axis=1), 1.0)
    w = np.array([1, 2, 1])[:, None]
    want = (keys[[0, 1, 4]] * w).sum(0)
    assert np.allclose(vec[0], want / np.linalg.norm(want))
    again, ks2 = bound_keys(keys, srcs, 2)
    assert np.array_equal(again, vec) and ks2 == ks  # deterministic
    same, ks3 = bound_keys(keys, srcs, 5)
    assert same is keys and ks3 == srcs
    text = [1.0] + [0.0] * 7
    emb, k = fit_node([text, *keys.tolist(), keys[-1].tolist()], srcs, 3)
    assert len(emb) == 3 and emb[0] == text and k == ks
    assert fit_node([text, *keys.tolist()], srcs, 1) == ([text], None)
    assert fit_node([text, text, text], None, 2) == ([text], None)  # padding dropped
    assert vector_bound("auto", 377, 193) == 1 and vector_bound("auto", 377, 127) == 2
    assert vector_bound(4, 377, 193) == 4 and vector_bound("all", 377, 193) is None
    for bad in (0, -1, 2.5, True, "some"):
        with pytest.raises(ValueError, match=r"vectors must be an integer >= 1, 'auto' or 'all', got "):
            vector_bound(bad, 377, 193)


def test_m3_vectors_flag(m3, tmp_path, capsys):
    from memforest_gpu.cli import main

    g = m3.build.build_video(6)
    src, dst = tmp_path / "video.pkl", tmp_path / "out.pkl"
    with open(src, "wb") as f:
        pickle.dump(g, f)
    assert main(["graph", "compress", str(src), str(dst), "--quiet", "--m3-vectors", "2"]) == 2
    assert "--m3-vectors bounds a merged node's text vector and keys: it applies with --keys K >= 2 or all, got " \
           "--keys 1" in capsys.readouterr().err
    assert not dst.exists()
    assert main(["graph", "compress", str(src), str(dst), "--quiet", "--m3-vectors", "2", "--keys", "all"]) == 0
    assert "per node; --m3-vectors 2: at most 2)" in capsys.readouterr().out
    with open(dst, "rb") as f:
        assert check_vectors_and_key_sources(pickle.load(f), 2) == 2
    assert main(["graph", "compress", str(src), str(tmp_path / "auto.pkl"), "--quiet"]) == 0
    n = len(_text_nodes(g))
    with open(tmp_path / "auto.pkl", "rb") as f:  # the preset: one vector per text node
        assert all(len(x.embeddings) == 1 for x in _text_nodes(pickle.load(f)))
    assert f"text-node vectors {n} -> " in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["graph", "compress", str(src), str(tmp_path / "o.pkl"), "--m3-vectors", "0"])
    assert "--m3-vectors: must be an integer >= 1, 'auto' or 'all', got '0'" in capsys.readouterr().err
    assert main(["graph", "compress", str(src), str(tmp_path / "p.pkl"), "--method", "streammeco",
                 "--m3-vectors", "2"]) == 2
    assert "--m3-vectors applies only with --method memforest" in capsys.readouterr().err
    jsonl = tmp_path / "g.jsonl"
    jsonl.write_text('{"kind": "node", "id": "a", "type": "episodic", "text": "x", "embedding": [1.0, 0.0]}\n')
    assert main(["graph", "compress", str(jsonl), str(tmp_path / "o.jsonl"), "--m3-vectors", "2"]) == 2
    assert "--m3-vectors applies only to an M3-Agent graph" in capsys.readouterr().err
