"""The context a search gives (retrieval/context.py): the parts of merged nodes that matched first,
a token budget filled, the evaluation's ranked fill the same pieces, and clear refusals."""
from __future__ import annotations

import numpy as np
import pytest
from eval_fixtures import DAY0, BagOfWordsEmbedder
from test_long_memories import _store_and_questions

from memforest_gpu.config import RetrievalConfig
from memforest_gpu.evaluation.context_fill import contexts, score_contexts
from memforest_gpu.evaluation.harness import EvalConfig, _score_store, ranked_candidates
from memforest_gpu.evaluation.key_parts import key_split
from memforest_gpu.evaluation.metrics import NodeViews, tokens
from memforest_gpu.retrieval.context import context
from memforest_gpu.retrieval.retriever import Retriever, search
from memforest_gpu.store.memory_store import MemoryStore
from memforest_gpu.store.merged_keys import derive_keys
from memforest_gpu.store.timeutil import format_date

DAY = 86400.0
ORIGINALS = {
    "a": ("Alice adopted a grey cat named Miso.", DAY0),
    "b": ("Alice sings in a gospel choir on Sundays.", DAY0 + DAY),
    "c": ("Bob bought a red bicycle in Porto.", DAY0 + 3 * DAY),
    "f0": ("The weather report promised snow.", DAY0 + 4 * DAY),
    "f1": ("Dana planted tulips near the fence.", DAY0 + 5 * DAY),
}


def merged_store():
    """One tenant: ``m`` merged from a, b, c (text in time order, c last with its own date tag),
    every source a key; two originals. Returns (originals' store, merged store, embedder)."""
    emb = BagOfWordsEmbedder()
    inp = MemoryStore.from_records([{"id": i, "text": t, "timestamp": ts, "tenant": "t"}
                                    for i, (t, ts) in ORIGINALS.items()], embedder=emb)
    text = f"{ORIGINALS['a'][0]} {ORIGINALS['b'][0]} [{format_date(ORIGINALS['c'][1])}] {ORIGINALS['c'][0]}"
    texts = [text, ORIGINALS["f0"][0], ORIGINALS["f1"][0]]
    out = MemoryStore.from_columns(ids=["m", "f0", "f1"], texts=texts,
                                   timestamps=[DAY0, ORIGINALS["f0"][1], ORIGINALS["f1"][1]],
                                   embeddings=emb.embed(texts).numpy(), tenants=["t"] * 3,
                                   sources=[["a", "b", "c"], ["f0"], ["f1"]])
    out.keys = derive_keys(inp, out.sources.arrow, max_keys=None, text_weight=0.5)
    return inp, out, emb


def test_the_piece_that_matched_comes_first_though_the_node_begins_with_other_sources():
    _, out, emb = merged_store()
    q = emb.embed(["Where did Bob buy the red bicycle? Porto?"])
    res = Retriever(out).search(q, config=RetrievalConfig(k=3))
    assert out.ids[int(res.index[0, 0])] == "m"
    ranked = context(out, res, q, max_tokens=12, embedder=emb)[0]
    first = ranked[0]
    assert (first.id, first.sources, first.cut) == ("m", ["c"], False)
    assert first.text == f"[{format_date(ORIGINALS['c'][1])}] {ORIGINALS['c'][0]}"  # its own date, not the node's
    assert first.score > ranked[1].score
    plain = context(out, res, q, max_tokens=12, fill="plain")[0]  # the whole node: Alice's sentences fill the budget
    assert len(plain) == 1 and plain[0].cut and plain[0].text.startswith(f"[{format_date(DAY0)}] Alice")
    assert "porto" not in tokens(plain[0].text) and "porto" in tokens(" ".join(p.text for p in ranked))
    for ctx in (ranked, plain):
        assert sum(len(p.text.split()) for p in ctx) == 12  # the budget, the last piece cut to fit
        assert all(not p.cut for p in ctx[:-1])
    assert context(out, res, q, max_tokens=np.int64(12), embedder=emb)[0] == ranked  # numpy's integers too
    big = context(out, res, q, max_tokens=10_000, embedder=emb)[0]  # every sentence once, nothing cut
    shown = " ".join(p.text for p in big)
    assert all(shown.count(t) == 1 for t, _ in ORIGINALS.values()) and not any(p.cut for p in big)
    assert sorted(s for p in big for s in p.sources) == ["a", "b", "c", "f0", "f1"]


def test_search_gives_the_context_by_default_pooled_for_a_store_with_merged_nodes():
    _, out, emb = merged_store()
    query = "Where did Bob buy the red bicycle? Porto?"
    pieces = search(out, query, embedder=emb, max_tokens=12)[0]
    assert pieces[0]["sources"] == ["c"] and set(pieces[0]) == {"id", "sources", "text", "score", "cut"}
    assert search(out, query, embedder=emb, max_tokens=12, fill="pooled") == [pieces]
    assert search(out, query, embedder=emb, max_tokens=12, fill="ranked")[0][0] == pieces[0]  # the same first part
    whole = search(out, query, embedder=emb, max_tokens=12, fill="plain")[0]
    assert whole[0]["sources"] == ["a", "b", "c"] and whole[0]["cut"]
    bare = out.take(np.arange(len(out)))
    bare.keys = None  # no keys (one vector per node): whole nodes, pooled by default, which needs the embedder
    q = emb.embed([query])
    assert search(bare, q, max_tokens=12, fill="plain") == search(bare, q, max_tokens=12, fill="ranked")
    assert search(bare, q, max_tokens=12, embedder=emb) == search(bare, q, max_tokens=12, embedder=emb, fill="pooled")
    with pytest.raises(ValueError, match="needs the embedder"):
        search(bare, q, max_tokens=12)
    originals = out.take(np.flatnonzero([len(s) == 1 for s in out.sources]))
    originals.keys = None  # a store of originals: whole nodes, no embedder needed
    assert search(originals, q, max_tokens=12) == search(originals, q, max_tokens=12, fill="plain")
    assert len(search(out, query, embedder=emb)[0]) == 3  # no max_tokens: the hits, as before


@pytest.mark.parametrize("kw, msg", [
    ({"max_tokens": 12, "fill": "parts"}, "fill must be one of"),
    ({"max_tokens": 0}, "max_tokens must be an integer >= 4"),
    ({"max_tokens": 3, "fill": "plain"}, "max_tokens must be an integer >= 4"),
    ({"max_tokens": -3, "fill": "plain"}, "max_tokens must be an integer >= 4"),
    ({"max_tokens": 2.5, "fill": "plain"}, "max_tokens must be an integer >= 1"),
    ({"fill": "ranked"}, "needs max_tokens"),
    ({"max_tokens": 12}, "needs the embedder"),
    ({"max_tokens": 12, "fill": "ranked"}, "needs the embedder"),
])
def test_refusals(kw, msg):
    _, out, emb = merged_store()
    with pytest.raises(ValueError, match=msg):
        search(out, emb.embed(["bicycle"]), **kw)


def test_search_shows_a_piece_with_its_whole_date_and_a_word_or_not_at_all():
    _, out, emb = merged_store()
    bare = out.take(np.arange(len(out)))
    bare.keys = None  # whole nodes, each "[date] text"
    q = emb.embed(["Where did Bob buy the red bicycle? Porto?"])
    full = search(bare, q, max_tokens=10_000, fill="plain")[0]
    first = len(full[0]["text"].split())
    res = Retriever(bare).search(q, config=RetrievalConfig(k=40))
    for left in (1, 2, 3):  # what the budget leaves the second piece: part of its date tag, or the tag alone
        assert [p["id"] for p in search(bare, q, max_tokens=first + left, fill="plain")[0]] == [full[0]["id"]]
        cut = context(bare, res, q, max_tokens=first + left, fill="plain")[0]  # the evaluation's cut: as tokens fall
        assert len(cut) == 2 and len(cut[1].text.split()) == left
    got = search(bare, q, max_tokens=first + 4, fill="plain")[0]
    assert len(got) == 2 and got[1]["cut"] and got[1]["text"] == " ".join(full[1]["text"].split()[:4])


def test_the_evaluations_ranked_fill_is_the_products_context():
    store, out, q = _store_and_questions(ratio=0.75)
    emb = BagOfWordsEmbedder()
    originals = dict(zip(store.ids, store.texts))
    views = NodeViews.build(out, originals)
    assert out.keys is not None and (out.keys.counts > 1).any()
    for kind in ("plain", "agpr"):
        ranked = ranked_candidates(Retriever(out), q.emb, q.tenants, EvalConfig(search_repeats=1), kind)
        res = Retriever(out).search(q.emb, tenants=q.tenants, config=EvalConfig().ranking(kind))
        assert np.array_equal(res.index.numpy(), ranked)
        for budget in (5, 9, 40):
            ev = contexts(ranked, out, views, budget, fill="ranked", q_emb=q.emb, original_text=originals,
                          split=key_split(emb.embed))
            prod = context(out, res, q.emb, max_tokens=budget, fill="ranked", embedder=emb)
            assert [[(j, v.rendered if c is None else v.rendered[:c]) for j, v, c in x] for x in ev] == \
                [[(p.node, p.text) for p in x] for x in prod]
            got = score_contexts(ev, q.answers, q.evidence)["ansr"]
            want = [len(a & set().union(*(tokens(p.text) for p in x))) / len(a) for a, x in zip(q.answers, prod)]
            np.testing.assert_allclose(got, want)
    # memforest eval --fill ranked: the @B of both retrievers is that context
    _, sc, _ = _score_store(out, q, EvalConfig(search_repeats=1, max_tokens=9, fill="ranked"), originals, embedder=emb)
    ranked = ranked_candidates(Retriever(out), q.emb, q.tenants, EvalConfig(search_repeats=1), "plain")
    ev = contexts(ranked, out, views, 9, fill="ranked", q_emb=q.emb, original_text=originals,
                  split=key_split(emb.embed))
    np.testing.assert_array_equal(sc["plain", "B", "ansr"], score_contexts(ev, q.answers, q.evidence)["ansr"])
    with pytest.raises(ValueError, match="fill must be one of"):
        EvalConfig(fill="parts")


def test_memforest_search_max_tokens_prints_the_pieces(tmp_path, monkeypatch, capsys):
    import json

    from memforest_gpu import api
    from memforest_gpu.cli.commands import main
    from memforest_gpu.store.io import write_store

    _, out, emb = merged_store()
    path = tmp_path / "m.parquet"
    write_store(out, path)
    monkeypatch.setattr(api, "load_store_and_embedder", lambda p, **kw: (api.read_store(p), emb))
    query = "Where did Bob buy the red bicycle? Porto?"
    assert main(["search", str(path), query, "--max-tokens", "12", "--json"]) == 0
    pieces = json.loads(capsys.readouterr().out)
    # 10 of the 12 tokens: the next piece would show 2 tokens of its date tag, so it is left out
    assert pieces[0]["sources"] == ["c"] and sum(len(p["text"].split()) for p in pieces) == 10
    assert main(["search", str(path), query, "--budget", "12", "--json"]) == 0  # the old flag, one more release
    captured = capsys.readouterr()
    assert json.loads(captured.out) == pieces and "--budget is renamed --max-tokens" in captured.err
    assert main(["search", str(path), query, "--max-tokens", "12", "--fill", "plain"]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith(" 1. (") and "[cut]" in shown and "Porto" not in shown
    assert main(["search", str(path), query, "--max-tokens", "3"]) != 0
    assert "--max-tokens must be an integer >= 4 (whitespace tokens; a piece's date tag takes 3), got 3" in \
        capsys.readouterr().err
    assert main(["search", str(path), query, "--fill", "ranked"]) != 0
    assert "--fill ranked needs --max-tokens" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["search", str(path), query, "--max-tokens", "12", "--fill", "parts"])
    assert "invalid choice" in capsys.readouterr().err


def test_rule_order_interleaves_parts_lazily_and_sorts_in_a_node_agpr_moved_down():
    from memforest_gpu.retrieval.context import in_rule_order

    def nodes():
        yield [(0.9, "a1"), (0.5, "a2")]
        yield [(0.8, "b1"), (0.7, "b2")]
        read.append("c")
        yield [(0.95, "c1")]  # ranked third (by AGPR) though it scores highest
    read: list = []
    it = in_rule_order(nodes())
    assert next(it) == "a1" and read == []  # nothing after b is read to show a1
    assert list(it) == ["c1", "b1", "b2", "a2"]


def test_a_store_without_keys_keeps_the_hits_order_under_either_fill():
    """AGPR may rank a node above one that scores higher: without keys, no fill re-sorts them."""
    from memforest_gpu.retrieval.retriever import SearchResult
    store, out, q = _store_and_questions(ratio=0.75)
    emb = BagOfWordsEmbedder()
    originals = dict(zip(store.ids, store.texts))
    for s in (store, out):
        bare = s.take(np.arange(len(s)))
        bare.keys = None
        top = Retriever(bare).search(q.emb, tenants=q.tenants, config=RetrievalConfig(k=6))
        res = SearchResult(top.index.flip(1), top.score.flip(1), top.similarity.flip(1))  # worst first
        a = context(bare, res, q.emb, max_tokens=30, fill="ranked", embedder=emb)
        b = context(bare, res, q.emb, max_tokens=30, fill="plain")
        assert [[(p.node, p.text) for p in x] for x in a] == [[(p.node, p.text) for p in x] for x in b]
        assert [[p.node for p in x] for x in b] == [[j for j in row if j >= 0][:len(x)] for x, row in
                                                    zip(b, res.index.tolist())]
        ev = contexts(res.index.numpy(), bare, NodeViews.build(bare, originals), 30, fill="ranked", q_emb=q.emb,
                      original_text=originals, split=key_split(emb.embed))
        assert [[j for j, _, _ in x] for x in ev] == [[p.node for p in x] for x in b]


def test_the_old_budget_keyword_still_works_with_a_warning():
    """``budget=`` is the old name of ``max_tokens=`` (one more release, a DeprecationWarning)."""
    from memforest_gpu.retrieval.retriever import search

    _, out, emb = merged_store()
    query = "Where did Bob buy the red bicycle? Porto?"
    with pytest.warns(DeprecationWarning, match="max_tokens"):
        old = search(out, query, embedder=emb, budget=12)
    assert old == search(out, query, embedder=emb, max_tokens=12)
    with pytest.raises(TypeError, match="both"):
        search(out, query, embedder=emb, budget=12, max_tokens=12)
    with pytest.raises(TypeError, match="unexpected keyword argument 'tokens'"):
        search(out, query, embedder=emb, tokens=12)


def test_a_knowledge_update_keeps_the_newer_value_first_through_compress_and_search():
    """The old and the new value of a fact, merged by the default compression, are both kept and the
    newer is read first in the default context, whole or cut at the budget (docs/method.md, the
    extractive merger)."""
    import dataclasses

    from memforest_gpu import CompressConfig, compress

    emb = BagOfWordsEmbedder()
    notes = [("old", "Caroline: I live in Denver near the park.", DAY0),
             ("x1", "Melanie painted a lake at sunrise.", DAY0 + 10 * DAY),
             ("new", "Caroline: I moved, I now live in Austin near the park.", DAY0 + 40 * DAY),
             ("x2", "Dana planted tulips near the fence.", DAY0 + 50 * DAY)]
    inp = MemoryStore.from_records([{"id": i, "text": t, "timestamp": ts, "tenant": "t"} for i, t, ts in notes],
                                   embedder=emb)
    cfg = CompressConfig()
    cfg = dataclasses.replace(cfg, merge=dataclasses.replace(cfg.merge, ratio=0.25))
    out = compress(inp, cfg, embedder=emb, device="cpu").store
    (node,) = [j for j, s in enumerate(out.sources) if len(s) > 1]
    assert sorted(out.sources[node]) == ["new", "old"]
    text = out.texts[node]
    assert text.index("Austin") < text.index("Denver")
    query = "Where does Caroline live now?"
    whole = search(out, query, embedder=emb, max_tokens=10_000)[0][0]  # the default fill, nothing cut
    assert whole["sources"] == ["old", "new"] and whole["text"] == text  # its own tags, not one more
    assert whole["text"].index("Austin") < whole["text"].index("Denver")
    cut = search(out, query, embedder=emb, max_tokens=12, fill="plain")[0]  # the head of the node: the newer value
    assert len(cut) == 1 and cut[0]["cut"] and "Austin" in cut[0]["text"] and "Denver" not in cut[0]["text"]
