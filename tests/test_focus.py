"""``fill="focused"`` (retrieval/context.py): a piece longer than what is left of the budget shows its
sentences that match the query best instead of its first tokens; the evaluation scores the same pieces."""
from __future__ import annotations

import numpy as np
import pytest
from eval_fixtures import DAY0, BagOfWordsEmbedder
from test_context import merged_store
from test_long_memories import _store_and_questions

from memforest_gpu.config import RetrievalConfig
from memforest_gpu.evaluation.context_fill import contexts, score_contexts
from memforest_gpu.evaluation.harness import EvalConfig, _score_store, ranked_candidates
from memforest_gpu.evaluation.key_parts import key_split
from memforest_gpu.evaluation.metrics import NodeViews, tokens
from memforest_gpu.retrieval.context import POOL, Piece, context, fit_focused, focus
from memforest_gpu.retrieval.retriever import Retriever, search
from memforest_gpu.store.memory_store import MemoryStore
from memforest_gpu.store.timeutil import format_date

SESSION = ("Alice talked about her grey cat for a long while. She said the cat sleeps all day. "
           "Then the weather came up and nobody liked the rain. Bob bought a red bicycle in Porto. "
           "They agreed to meet again next week.")


def session_store():
    """One long original (a session) and a short one, no keys (the uncompressed store)."""
    emb = BagOfWordsEmbedder()
    store = MemoryStore.from_records([{"id": "s1", "text": SESSION, "timestamp": DAY0, "tenant": "t"},
                                      {"id": "s2", "text": "Dana planted tulips.", "timestamp": DAY0 + 86400,
                                       "tenant": "t"}], embedder=emb)
    return store, emb


def test_a_node_longer_than_the_budget_shows_the_sentence_that_matched():
    store, emb = session_store()
    q = emb.embed(["Where did Bob buy the red bicycle? Porto?"])
    res = Retriever(store).search(q, config=RetrievalConfig(k=2))
    assert store.ids[int(res.index[0, 0])] == "s1"
    tag = f"[{format_date(DAY0)}]"
    first = context(store, res, q, max_tokens=12, fill="plain")[0]  # the first tokens: Alice's cat, no Porto
    assert len(first) == 1 and first[0].cut and "porto" not in tokens(first[0].text)
    got = context(store, res, q, max_tokens=12, fill="focused", embedder=emb)[0]
    assert len(got) == 1 and got[0].cut and got[0].sources == ["s1"]
    assert got[0].text == f"{tag} Bob bought a red bicycle in Porto."  # 8 tokens: the other sentences do not fit
    more = context(store, res, q, max_tokens=30, fill="focused", embedder=emb)[0]
    assert len(more[0].text.split()) <= 30 and "Porto." in more[0].text and more[0].text.startswith(tag)
    kept = more[0].text[len(tag) + 1:]  # the sentences kept are written in text order, each once
    sents = [s + "." for s in SESSION.split(". ")]
    sents[-1] = sents[-1][:-1]
    pos = [SESSION.index(s) for s in sents if s in kept]
    assert pos == sorted(pos) and len(pos) >= 2 and kept == " ".join(s for s in sents if s in kept)
    whole = context(store, res, q, max_tokens=1000, fill="focused", embedder=emb)[0]  # fits: nothing focused
    assert [p.cut for p in whole] == [False, False]
    assert whole == context(store, res, q, max_tokens=1000, fill="plain")[0]


def test_focus_cuts_the_best_sentence_when_no_sentence_fits():
    _, emb = session_store()
    p = Piece(0, "s1", ["s1"], f"[{format_date(DAY0)}] {SESSION}", 1.0)
    got = focus(p, 6, emb.embed(["red bicycle Porto"])[0], emb.embed, DAY0)  # the tag is 3 tokens
    assert got.cut and got.text == f"[{format_date(DAY0)}] Bob bought a"


def test_focused_parts_of_a_merged_node_keep_the_budget():
    _, out, emb = merged_store()
    q = emb.embed(["Where did Alice adopt the grey cat Miso?"])
    res = Retriever(out).search(q, config=RetrievalConfig(k=3))
    ranked = context(out, res, q, max_tokens=10, embedder=emb)[0]
    focused = context(out, res, q, max_tokens=10, fill="focused", embedder=emb)[0]
    assert [p.text for p in focused if not p.cut] == [p.text for p in ranked if not p.cut]  # only the last changes
    assert sum(len(p.text.split()) for p in focused) <= 10
    with pytest.raises(ValueError, match="fill='focused' needs the embedder"):
        context(out, res, q, max_tokens=10, fill="focused")
    with pytest.raises(ValueError, match="fill='focused' needs the embedder"):
        search(out, q, max_tokens=10, fill="focused")


def test_the_evaluations_focused_fill_is_the_products_context():
    store, out, q = _store_and_questions(ratio=0.75)
    emb = BagOfWordsEmbedder()
    originals = dict(zip(store.ids, store.texts))
    for st in (out, store):  # the compressed store and the uncompressed one (no keys)
        views = NodeViews.build(st, originals)
        ranked = ranked_candidates(Retriever(st), q.emb, q.tenants, EvalConfig(search_repeats=1), "plain")
        res = Retriever(st).search(q.emb, tenants=q.tenants, config=EvalConfig().ranking("plain"))
        for budget in (3, 5, 9, 40):
            ev = contexts(ranked, st, views, budget, fill="focused", q_emb=q.emb, original_text=originals,
                          split=key_split(emb.embed))
            prod = context(st, res, q.emb, max_tokens=budget, fill="focused", embedder=emb)
            assert [[(j, v.rendered) for j, v, c in x] for x in ev] == [[(p.node, p.text) for p in x] for x in prod]
            assert all(c is None for x in ev for _, _, c in x)
            got = score_contexts(ev, q.answers, q.evidence)["ansr"]
            want = [len(a & set().union(*(tokens(p.text) for p in x))) / len(a) for a, x in zip(q.answers, prod)]
            np.testing.assert_allclose(got, want)
            assert max(len(" ".join(p.text for p in x).split()) for x in prod) <= budget
    _, sc, _ = _score_store(out, q, EvalConfig(search_repeats=1, max_tokens=5, fill="focused"), originals, embedder=emb)
    ranked = ranked_candidates(Retriever(out), q.emb, q.tenants, EvalConfig(search_repeats=1), "plain")
    ev = contexts(ranked, out, NodeViews.build(out, originals), 5, fill="focused", q_emb=q.emb,
                  original_text=originals, split=key_split(emb.embed))
    np.testing.assert_array_equal(sc["plain", "B", "ansr"], score_contexts(ev, q.answers, q.evidence)["ansr"])


def test_pooled_sentences_of_the_next_pieces_compete_for_what_is_left():
    emb = BagOfWordsEmbedder()
    first = SESSION.replace(" Bob bought a red bicycle in Porto.", "")
    second = "Carol repaired an old clock. Bob bought a red bicycle in Porto. The clock still ticks loudly."
    pieces = [Piece(0, "s1", ["s1"], f"[{format_date(DAY0)}] {first}", 0.9),
              Piece(1, "s2", ["s2"], f"[{format_date(DAY0 + 86400)}] {second}", 0.8)]
    q = emb.embed(["Where did Bob buy the red bicycle? Porto?"])[0]
    ts = [DAY0, DAY0 + 86400]
    one = fit_focused(pieces, 14, q, emb.embed, ts)  # the first piece alone, focused
    assert [p.id for p in one] == ["s1"] and one[0].cut and "porto" not in tokens(one[0].text)
    pooled = fit_focused(pieces, 14, q, emb.embed, ts, pool=POOL)  # both pieces' sentences compete
    assert "Porto." in " ".join(p.text for p in pooled) and all(p.cut for p in pooled)
    assert [p.id for p in pooled] == sorted(p.id for p in pooled)  # in the pieces' order
    got = {p.id: p.text for p in pooled}
    assert got["s2"].startswith(f"[{format_date(DAY0 + 86400)}] ") and "Bob bought a red bicycle in Porto." in got["s2"]
    assert sum(len(p.text.split()) for p in pooled) <= 14
    assert fit_focused(pieces, 1000, q, emb.embed, ts, pool=POOL) == pieces  # everything fits: nothing changes


def test_one_context_call_embeds_each_sentence_once():
    store, emb = session_store()
    q = emb.embed(["Where did Bob buy the red bicycle? Porto?"])
    res = Retriever(store).search(q, config=RetrievalConfig(k=2))
    emb.calls = 0
    one = context(store, res, q, max_tokens=12, fill="pooled", embedder=emb)
    once = emb.calls
    assert once > 0
    q2 = q.repeat(3, 1)
    res2 = Retriever(store).search(q2, config=RetrievalConfig(k=2))
    emb.calls = 0
    three = context(store, res2, q2, max_tokens=12, fill="pooled", embedder=emb)
    assert three == one * 3 and emb.calls == once  # the same sentences, embedded once
