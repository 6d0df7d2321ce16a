"""Issue 38: long-memory shapes, the matched context fill and the lost-answer causes."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from eval_fixtures import DAY0, BagOfWordsEmbedder

from memforest_gpu.config import preset
from memforest_gpu.evaluation.context_fill import contexts, matched_render, score_contexts, view_of
from memforest_gpu.evaluation.harness import EvalConfig, _Questions, ranked_candidates
from memforest_gpu.evaluation.long_shapes import UPDATES, load_shape
from memforest_gpu.evaluation.lost_answers import classify, update_reading
from memforest_gpu.evaluation.methods import compress_with, parse_method
from memforest_gpu.evaluation.metrics import NodeViews, score_ranked
from memforest_gpu.retrieval.retriever import Retriever
from memforest_gpu.sentences import split_sentences


def _locomo(path, sessions: int = 4):
    conv = {"speaker_a": "Ann", "speaker_b": "Bo"}
    obs = {}
    for s in range(1, sessions + 1):
        conv[f"session_{s}_date_time"] = f"9:00 am on {s} May, 2023"
        conv[f"session_{s}"] = [{"speaker": sp, "dia_id": f"D{s}:{i + 1}", "text": f"Turn {i} of session {s} by {sp}."}
                                for i, sp in enumerate(["Ann", "Bo", "Ann", "Bo", "Ann"])]
        obs[f"session_{s}_observation"] = {"Ann": [[f"Ann did thing {s}.", f"D{s}:1"]],
                                           "Bo": [[f"Bo did thing {s}.", f"D{s}:2"]]}
    qa = [{"question": "q1", "answer": "thing", "evidence": ["D1:2; D3:1"], "category": 1}]
    with open(path, "w") as f:
        json.dump([{"sample_id": "c", "conversation": conv, "observation": obs, "qa": qa}], f)
    return str(path)


def test_sessions_shape(tmp_path):
    b = load_shape(_locomo(tmp_path / "l.json"), "sessions")
    assert [n["id"] for n in b.nodes] == ["c:S1", "c:S2", "c:S3", "c:S4"]
    assert b.nodes[0]["text"].startswith("Ann: Turn 0 of session 1 by Ann. Bo: Turn 1")
    assert b.questions[0].evidence == ("c:S1", "c:S3")


@pytest.mark.parametrize("shape", ["ku", "ku_facts"])
def test_knowledge_update_shapes(tmp_path, shape):
    b = load_shape(_locomo(tmp_path / "l.json"), shape)
    text = {n["id"]: n["text"] for n in b.nodes}
    ts = {n["id"]: n["timestamp"] for n in b.nodes}
    assert len(b.questions) == 2 * len(UPDATES)  # two speakers, every attribute
    for q in b.questions:
        u = b.info["updates"][q.id]
        assert q.answer == u["new"] != u["old"] and q.evidence == (u["new_id"],) and q.category == "ku"
        assert u["new"] in text[u["new_id"]] and u["old"] in text[u["old_id"]]
        assert ts[u["old_id"]] <= ts[u["new_id"]]  # the old value is said first (a window may hold both)
    assert load_shape(_locomo(tmp_path / "l.json"), shape).nodes == b.nodes  # deterministic


def _store_and_questions(ratio=0.5):
    emb = BagOfWordsEmbedder()
    facts = [f"Notes on {w}. The {w} {w} story." for w in
             ("apples", "boats", "cellos", "dunes", "eagles", "ferns", "geese", "harps")]
    nodes = [{"id": f"t:n{i}", "text": t, "timestamp": DAY0 + 86400 * i, "tenant": "t"} for i, t in enumerate(facts)]
    from memforest_gpu.evaluation.dataset import Benchmark, Question
    qs = [Question(f"t:q{i}", "t", f"{w} {w}?", w, (f"t:n{i}",), "1")
          for i, w in enumerate(("apples", "boats", "cellos", "dunes", "eagles", "ferns", "geese", "harps"))]
    bench = Benchmark("syn", nodes, qs)
    store = bench.store(emb, device="cpu")
    q = _Questions(bench, emb, "cpu")
    spec = parse_method("memforest:matching")
    cfg = preset("memforest")
    cfg = dataclasses.replace(cfg, merge=dataclasses.replace(cfg.merge, keys=-1))  # every source a key: parts per key
    out = compress_with(spec, store, spec.config(cfg, ratio=ratio, seed=0), embedder=emb, device="cpu").store
    return store, out, q


@pytest.mark.parametrize("budget", [7, 20, 256])
def test_plain_fill_is_the_protocol(budget):
    store, out, q = _store_and_questions()
    originals = dict(zip(store.ids, store.texts))
    views = NodeViews.build(out, originals)
    ranked = ranked_candidates(Retriever(out), q.emb, q.tenants, EvalConfig(search_repeats=1), "plain")
    want = score_ranked(ranked, views, q.answers, q.evidence, max_tokens=budget)
    got = score_contexts(contexts(ranked, out, views, budget), q.answers, q.evidence)
    for m, v in got.items():
        np.testing.assert_array_equal(v, want["B", m], err_msg=m)


def test_matched_fill_puts_the_matching_source_first_and_keeps_every_sentence():
    store, out, q = _store_and_questions()
    originals = dict(zip(store.ids, store.texts))
    ts = dict(zip(store.ids, store.timestamps.tolist()))
    views = NodeViews.build(out, originals)
    ranked = ranked_candidates(Retriever(out), q.emb, q.tenants, EvalConfig(search_repeats=1), "plain")
    ctx = contexts(ranked, out, views, 8, fill="matched", q_emb=q.emb, original_text=originals, original_ts=ts)
    plain = score_contexts(contexts(ranked, out, views, 8), q.answers, q.evidence)
    matched = score_contexts(ctx, q.answers, q.evidence)
    assert np.nanmean(matched["ansr"]) == 1.0 > np.nanmean(plain["ansr"])  # each first node is merged here
    for j, text in enumerate(out.texts):
        if len(out.sources[j]) < 2:
            continue
        src = list(out.sources[j])
        rendered, starts = matched_render(text, float(out.timestamps[j]), src, {src[-1]: 1.0, src[0]: 0.0},
                                          originals, ts)
        assert starts[src[-1]] < starts[src[0]]
        assert sorted(split_sentences(rendered.replace("[", "\n["))) != []
        kept = {s for s in split_sentences(text) if not s.startswith("[")}
        assert all(s.split("] ")[-1] in rendered for s in kept)


def test_classify_names_the_cause():
    orig = {"a": "Alice owns a boat named Wave.", "b": "Bob likes tea."}
    base = [[(0, view_of("[1 May 2023] Alice owns a boat named Wave.", ["a"], {"a": 13}), None)]]

    class S:  # a compressed store of one merged node
        sources = [["a", "b"]]
        texts = ["Alice owns a boat. Bob likes tea."]  # "named Wave" dropped by the merge
    ans, ev = [frozenset({"wave"})], [frozenset({"a"})]
    comp = [[(0, view_of("[1 May 2023] " + S.texts[0], ["a", "b"], {"a": 13, "b": 32}), None)]]
    cause, lost = classify(base, comp, S, ans, ev, orig)
    assert cause.tolist() == ["condensed"] and lost.tolist() == [1.0]
    S.texts = ["Alice owns a boat named Wave. Bob likes tea."]
    assert classify(base, [[]], S, ans, ev, orig)[0].tolist() == ["not_found"]
    assert classify(base, [[]], S, ans, ev, orig, np.array([[1, 0]]))[0].tolist() == ["not_found"]
    assert classify(base, [[]], S, ans, ev, orig, np.array([[0, 1]]))[0].tolist() == ["crowded"]  # rank 0 < 1 node
    cut = [[(0, view_of("[1 May 2023] Bob likes tea. Alice owns a boat named Wave.", ["a", "b"],
                         {"b": 13, "a": 28}), 20)]]
    assert classify(base, cut, S, ans, ev, orig)[0].tolist() == ["too_long"]
    reading = update_reading(comp, {"q": {"old": "tea", "new": "Wave"}}, ["q"])
    assert reading == {"questions": 1, "new_shown": 0, "stale": 1, "old_first": 0}


def test_parts_fill_goes_breadth_first_and_shows_every_part_in_time():
    store, out, q = _store_and_questions(ratio=0.75)
    originals = dict(zip(store.ids, store.texts))
    ts = dict(zip(store.ids, store.timestamps.tolist()))
    views = NodeViews.build(out, originals)
    ranked = ranked_candidates(Retriever(out), q.emb, q.tenants, EvalConfig(search_repeats=1), "plain")
    kw = dict(q_emb=q.emb, original_text=originals, original_ts=ts)
    small = contexts(ranked, out, views, 16, fill="parts", **kw)
    for ctx in small:  # two parts of 7 tokens, from two nodes when there are two
        assert len({j for j, _, _ in ctx}) == min(2, len(out)) and all(len(v.sources) <= 1 for _, v, _ in ctx)
    assert np.nanmean(score_contexts(small, q.answers, q.evidence)["ansr"]) == 1.0
    big = contexts(ranked, out, views, 10_000, fill="parts", **kw)
    for ctx in big:  # every node's every source, once
        shown = sorted(s for _, v, _ in ctx for s in v.sources)
        assert shown == sorted(s for j in set(ranked[0].tolist()) - {-1} for s in out.sources[j])


def test_ranked_fill_orders_parts_by_their_own_key_and_is_matched_without_keys():
    import dataclasses
    store, out, q = _store_and_questions(ratio=0.75)
    originals = dict(zip(store.ids, store.texts))
    ts = dict(zip(store.ids, store.timestamps.tolist()))
    views = NodeViews.build(out, originals)
    ranked = ranked_candidates(Retriever(out), q.emb, q.tenants, EvalConfig(search_repeats=1), "plain")
    kw = dict(q_emb=q.emb, original_text=originals, original_ts=ts)
    ctx = contexts(ranked, out, views, 10, fill="ranked", **kw)
    assert np.nanmean(score_contexts(ctx, q.answers, q.evidence)["ansr"]) == 1.0
    assert [c[0][1].sources for c in ctx] == [[e] for x in q.evidence for e in x]  # the evidence's part first
    out.keys = None  # one vector per memory: a node is one piece, its parts ordered as under "matched"
    views = NodeViews.build(out, originals)
    ranked = ranked_candidates(Retriever(out), q.emb, q.tenants, EvalConfig(search_repeats=1), "plain")
    qs = [x.question for x in q.questions]
    a = contexts(ranked, out, views, 30, fill="ranked", questions=qs, **kw)
    b = contexts(ranked, out, views, 30, fill="matched", questions=qs, **kw)
    assert [[(j, v.rendered, c) for j, v, c in x] for x in a] == [[(j, v.rendered, c) for j, v, c in x] for x in b]
    assert dataclasses.is_dataclass(a[0][0][1])


def test_keep_policy_keeps_every_sentence_and_reaches_the_ratio():
    import dataclasses
    emb = BagOfWordsEmbedder()  # a window of 256 tokens
    nodes = [{"id": f"t:n{i}", "text": " ".join(f"w{i}x{k}." for k in range(150)), "timestamp": DAY0 + i, "tenant": "t"}
             for i in range(6)]
    from memforest_gpu.store.memory_store import MemoryStore
    store = MemoryStore.from_records(nodes, embedder=emb)
    spec = parse_method("memforest:matching")
    cfg = preset("memforest")
    for policy, whole in (("condense", False), ("keep", True)):
        c = dataclasses.replace(cfg, merge=dataclasses.replace(cfg.merge, cap_policy=policy))
        res = compress_with(spec, store, spec.config(c, ratio=0.5, seed=0), embedder=emb, device="cpu")
        assert len(res.store) == 3
        words = sum(len(t.split()) for t in res.store.texts)
        assert (words >= 6 * 150) == whole, (policy, words)


def test_key_split_finds_the_sources_parts_without_the_originals():
    from memforest_gpu.evaluation.context_fill import node_parts
    from memforest_gpu.evaluation.key_parts import key_split
    store, out, q = _store_and_questions(ratio=0.75)
    originals = dict(zip(store.ids, store.texts))
    ts = dict(zip(store.ids, store.timestamps.tolist()))
    split = key_split(BagOfWordsEmbedder().embed)
    for j in (j for j in range(len(out)) if len(out.sources[j]) > 1):  # originals are one part either way
        src = list(out.sources[j])
        want = node_parts(out.texts[j], float(out.timestamps[j]), src, {}, originals, ts)
        got = split(out, j)
        assert sorted(got) == sorted(want)
    views = NodeViews.build(out, originals)
    ranked = ranked_candidates(Retriever(out), q.emb, q.tenants, EvalConfig(search_repeats=1), "plain")
    kw = dict(q_emb=q.emb, original_text=originals, original_ts=ts)
    a = contexts(ranked, out, views, 10, fill="ranked", **kw)
    b = contexts(ranked, out, views, 10, fill="ranked", split=split, **kw)
    assert [[(j, v.rendered, v.sources, c) for j, v, c in x] for x in a] == \
        [[(j, v.rendered, v.sources, c) for j, v, c in x] for x in b]


def test_eval_reports_the_points_lost_to_condensing():
    """Long memories merged to the node cap lose words (condense); eval counts the answers lost that
    way per cell, and none when the cap keeps every sentence (keep)."""
    from memforest_gpu.evaluation.dataset import Benchmark, Question
    from memforest_gpu.evaluation.harness import run_grid

    emb = BagOfWordsEmbedder()  # a window of 256 tokens
    nodes = [{"id": f"t:n{i}", "text": " ".join(f"w{i}x{k}." for k in range(150)), "timestamp": DAY0 + i,
              "tenant": "t"} for i in range(8)]
    qs = [Question(f"t:q{i}-{k}", "t", f"w{i}x{k}", f"w{i}x{k}", (f"t:n{i}",), "1")
          for i in range(8) for k in (0, 75, 149)]
    base = preset("memforest")
    got = {}
    for policy in ("condense", "keep"):
        cfg = dataclasses.replace(base, merge=dataclasses.replace(base.merge, cap_policy=policy))
        res = run_grid(Benchmark("syn", nodes, qs), ["memforest:matching"], [0.5], [0], embedder=emb,
                       base_config=cfg, eval_config=EvalConfig(max_tokens=256, search_repeats=1), device="cpu")
        got[policy] = {r["metric"]: r["value"] for r in res.records
                       if r["method"] == "memforest" and r["metric"].startswith("condensed_")}
    assert got["condense"]["condensed_answers"] > 0 and got["condense"]["condensed_points"] > 0
    assert got["keep"] == {"condensed_answers": 0, "condensed_points": 0.0}
