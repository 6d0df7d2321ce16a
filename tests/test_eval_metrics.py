"""docs/evaluation.md's metrics: tokens, rendering, @k / @B cuts, strict evidence counting, AGPR ranking depth."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from memforest_gpu.evaluation.harness import EvalConfig, ranked_candidates
from memforest_gpu.evaluation.metrics import NodeViews, answer_tokens, render, score_ranked, source_starts, tokens
from memforest_gpu.evaluation.result_files import paired_bootstrap
from memforest_gpu.mergers.base import MemoryItem, MergePair
from memforest_gpu.mergers.extractive import ExtractiveMerger
from memforest_gpu.retrieval.retriever import Retriever
from memforest_gpu.store.memory_store import MemoryStore

DAY0 = 1683554160.0  # 8 May 2023
DAY = 86400.0


def test_tokens_and_answers():
    assert tokens("Mel's 2 dogs!") == ["mel", "s", "2", "dogs"]
    assert answer_tokens("The sunday before 25 May 2023") == {"sunday", "before", "25", "may", "2023"}
    assert answer_tokens("2022") == {"2022"}
    assert answer_tokens("the") == {"the"}  # nothing but stop words: keep them
    assert answer_tokens("...") == frozenset()
    assert render("Ann: hi", DAY0) == "[8 May 2023] Ann: hi"


def test_source_starts_in_merged_text():
    orig = {"a": "Ann: I adopted a dog. It is brown.", "b": "Bo: Nice! It is brown.", "c": "Ann: I adopted a dog."}
    m = ExtractiveMerger()
    t_ab = m.merge([MergePair(MemoryItem("a", orig["a"], DAY0), MemoryItem("b", orig["b"], DAY0 + DAY))])[0]
    assert t_ab == "[9 May 2023] Bo: Nice! [8 May 2023] Ann: I adopted a dog. It is brown."
    s = source_starts(t_ab, ["a", "b"], orig)
    assert s == {"a": t_ab.index("Ann:"), "b": t_ab.index("Bo:")}
    # c is an exact duplicate of a's first sentence: it counts where that sentence sits
    t_ac = m.merge([MergePair(MemoryItem("a", orig["a"], DAY0), MemoryItem("c", orig["c"], DAY0))])[0]
    assert t_ac == orig["a"]
    assert source_starts(t_ac, ["a", "c"], orig) == {"a": 0, "c": 0}
    # nothing found verbatim: counted at the end (credited only when the node is not cut)
    assert source_starts("something else", ["a", "b"], orig) == {"a": 14, "b": 14}
    assert source_starts("x", ["a"], orig) == {"a": 0}


def _store(texts, sources, ts=None):
    n = len(texts)
    return MemoryStore.from_columns(ids=[f"n{i}" for i in range(n)], texts=texts,
                                    timestamps=ts or [DAY0 + i for i in range(n)], embeddings=torch.eye(n, 8),
                                    sources=sources)


def test_cuts_and_strict_evidence():
    orig = {"a": "Ann: the cat is Miso.", "b": "Bo: the dog is Rex.", "c": "Ann: plums bake in winter.",
            "d": "Bo: violin lessons on Tuesday."}
    merged = "Ann: the cat is Miso. Bo: the dog is Rex."
    st = _store([merged, orig["c"], orig["d"]], [["a", "b"], ["c"], ["d"]])
    views = NodeViews.build(st, orig)
    # rendered lengths: 3 + 10, 3 + 5, 3 + 5 whitespace tokens
    assert [len(w) for w in views.ws_end] == [13, 8, 8]
    ranked = np.array([[0, 1, 2], [1, 0, 2], [1, 2, 0], [2, 0, -1]])
    ans = [answer_tokens("Rex"), answer_tokens("Rex"), answer_tokens("Rex"), answer_tokens("plums winter")]
    ev = [frozenset({"b"}), frozenset({"b"}), frozenset({"a", "b"}), frozenset()]
    out = score_ranked(ranked, views, ans, ev, k=2, max_tokens=12)
    # q0: the merged node is cut after 12 of its 13 tokens: "Rex." falls off, but b starts before the cut
    assert out["B", "ansr"][0] == 0.0 and out["B", "evr"][0] == 1.0 and out["B", "ctx"][0] == 12
    # q1: 8 tokens of node 1, then 4 of the merged node: "[8 May 2023] Ann:" -> b starts after the cut
    assert out["B", "ansr"][1] == 0.0 and out["B", "evr"][1] == 0.0 and out["B", "ctx"][1] == 12
    assert out["k", "ansr"][1] == 1.0 and out["k", "evr"][1] == 1.0 and out["k", "ctx"][1] == 21
    # q2: 8 + 4 tokens: the merged node never makes it into @k=2 either
    assert out["k", "evr"][2] == 0.0 and out["B", "evr"][2] == 0.0
    # q3: no evidence -> EvR undefined; "plums winter" found at @B (node 2 then node 0 cut: c not in them)
    assert math.isnan(out["B", "evr"][3]) and math.isnan(out["k", "evr"][3])
    assert out["B", "ansr"][3] == 0.0
    out = score_ranked(ranked, views, ans, ev, k=2, max_tokens=14)
    assert out["B", "ansr"][0] == 1.0 and out["B", "ctx"][0] == 14
    out = score_ranked(ranked[2:3], views, ans[2:3], ev[2:3], k=3, max_tokens=14)
    assert out["B", "evr"][0] == 0.0 and out["k", "evr"][0] == 1.0  # ranked third: 8 + 6 tokens fill the budget
    # 6 tokens of the merged node: "[8 May 2023] Ann: the cat" -> a counts, b does not
    out = score_ranked(np.array([[1, 0]]), views, [answer_tokens("cat")], [frozenset({"a", "b"})], k=2, max_tokens=14)
    assert out["B", "evr"][0] == 0.5 and out["B", "ansr"][0] == 1.0


def test_dates_in_context():
    """Dates: distinct dates shown (headers and merged text's tags); at @B only tags before the cut."""
    orig = {"a": "Ann: hi there.", "b": "Bo: the dog is Rex.", "c": "Ann: plums bake."}
    merged = "[8 May 2023] Ann: hi there. [10 May 2023] Bo: the dog is Rex."
    st = _store([merged, orig["c"]], [["a", "b"], ["c"]], ts=[DAY0 + 2 * DAY, DAY0])
    views = NodeViews.build(st, orig)
    assert [d for _, d in views.dates[0]] == ["10 May 2023", "8 May 2023", "10 May 2023"]
    assert [d for _, d in views.dates[1]] == ["8 May 2023"]
    # rendered: "[10 May 2023] [8 May 2023] Ann: hi there. [10 May 2023] Bo: ..." = 3 + 3 + 3 + 3 + 5 tokens
    ranked = np.array([[0, 1], [1, 0]])
    out = score_ranked(ranked, views, [frozenset({"x"})] * 2, [frozenset()] * 2, k=2, max_tokens=9)
    assert out["k", "dates"].tolist() == [2, 2]
    assert out["B", "dates"][0] == 2  # two distinct dates in the first 9 tokens
    assert out["B", "dates"][1] == 2  # "[8 May 2023] Ann: plums bake." then "[10 May 2023] [8 May"
    out = score_ranked(ranked, views, [frozenset({"x"})] * 2, [frozenset()] * 2, k=1, max_tokens=3)
    assert out["B", "dates"].tolist() == [1, 1] and out["k", "dates"].tolist() == [2, 1]


def test_ranked_list_prefix_is_the_retrievers_top_k():
    g = torch.Generator().manual_seed(0)
    n, D, Q = 300, 16, 40
    X = torch.nn.functional.normalize(torch.randn(n, D, generator=g), dim=1)
    ts = (torch.randint(0, 40, (n,), generator=g) * 3600.0).tolist()  # repeated timestamps: dense ranks tie
    st = MemoryStore.from_columns(ids=[str(i) for i in range(n)], texts=["x"] * n, timestamps=ts, embeddings=X,
                                  tenants=["a" if i % 3 else "b" for i in range(n)])
    qe = torch.nn.functional.normalize(torch.randn(Q, D, generator=g), dim=1)
    ten = ["a" if q % 2 else "b" for q in range(Q)]
    r = Retriever(st)
    cfg = EvalConfig(k=10)
    for kind in ("plain", "agpr"):
        full = ranked_candidates(r, qe, ten, cfg, kind)
        assert full.shape == (Q, 40)
        top = r.search(qe, tenants=ten, config=cfg.retrieval(kind)).index.numpy()
        np.testing.assert_array_equal(full[:, :10], top)
        assert all(len(set(row)) == len(row) for row in full.tolist())


def test_paired_bootstrap():
    a = np.array([1.0, 0.0, 1.0, np.nan, 0.5])
    assert paired_bootstrap(a, a) == (0.0, 0.0, 0.0)
    m, lo, hi = paired_bootstrap(a, a - 0.25)
    assert m == pytest.approx(0.25) and lo == pytest.approx(0.25) and hi == pytest.approx(0.25)
    rng = np.random.default_rng(0)
    x = rng.random(500)
    m, lo, hi = paired_bootstrap(x, x[rng.permutation(500)])
    assert lo < 0 < hi  # no real difference: the interval covers zero


def test_ansr_content_credits_dates_only_from_evidence_nodes():
    """AnsR counts a date header of any retrieved node; AnsR-content only the dates of nodes
    that hold the question's evidence (and always the node text)."""
    orig = {"a": "Ann: plums bake in winter.", "b": "Bo: violin lessons.", "c": "Ann: hi there.",
            "d": "Bo: the trip was long."}
    merged = "[8 May 2023] Ann: hi there. [10 May 2023] Bo: the trip was long."
    st = _store([orig["a"], orig["b"], merged], [["a"], ["b"], ["c", "d"]], ts=[DAY0, DAY0 + DAY, DAY0 + 2 * DAY])
    views = NodeViews.build(st, orig)
    assert views.content_tok[0] == frozenset(tokens(orig["a"]))  # the header's tokens are not content
    assert views.date_tok[2] == {"10", "8", "may", "2023"}
    may8, may9, may10 = answer_tokens("8 May 2023"), answer_tokens("9 May 2023"), answer_tokens("10 May 2023")
    ranked = np.array([[0, -1], [1, -1], [0, -1], [2, -1], [2, -1]])
    ans = [may8, may9, answer_tokens("plums"), may10, may10]
    ev = [frozenset({"b"}), frozenset({"b"}), frozenset({"b"}), frozenset({"x"}), frozenset({"d"})]
    out = score_ranked(ranked, views, ans, ev, k=1, max_tokens=100)
    for cut in ("k", "B"):
        assert out[cut, "ansr"].tolist() == [1.0, 1.0, 1.0, 1.0, 1.0]
        # q0: an unrelated node's header; q1: the evidence node's header; q2: node text;
        # q3: a merged node's date tags without the evidence; q4: with it
        assert out[cut, "ansr_content"].tolist() == [0.0, 1.0, 1.0, 0.0, 1.0]
    # @B cut before d's text: the merged node does not yet show the evidence -> no date credit
    # rendered: "[10 May 2023] [8 May 2023] Ann: hi there. [10 May 2023] Bo: ..." -> 9 tokens end at "there."
    out = score_ranked(ranked[4:5], views, ans[4:5], ev[4:5], k=1, max_tokens=9)
    assert out["B", "ansr"][0] == 1.0 and out["B", "ansr_content"][0] == 0.0
    out = score_ranked(ranked[4:5], views, ans[4:5], ev[4:5], k=1, max_tokens=13)
    assert out["B", "ansr_content"][0] == 1.0


def test_cluster_bootstrap_respects_conversations_and_seeds():
    from memforest_gpu.evaluation.result_files import cluster_bootstrap

    rng = np.random.default_rng(0)
    clusters = np.repeat(np.arange(5), 100)  # 5 conversations of 100 questions
    x = rng.random(500)
    assert cluster_bootstrap(x, x, clusters, n=200) == (0.0, 0.0, 0.0)
    m, lo, hi = cluster_bootstrap(x + 0.25, x, clusters, n=200)
    assert m == pytest.approx(0.25) and lo == pytest.approx(0.25) and hi == pytest.approx(0.25)
    # a difference that lives in one conversation: a question-level bootstrap calls it,
    # resampling conversations does not
    b = rng.random(500)
    a = b + np.where(clusters == 0, 0.5, 0.0) + 0.01 * rng.standard_normal(500)
    _, qlo, _ = paired_bootstrap(a, b, n=500)
    m, lo, hi = cluster_bootstrap(a, b, clusters, n=500)
    assert qlo > 0 and m == pytest.approx(0.1, abs=0.01) and lo <= 0 < hi
    # seed spread: seeds of a that disagree widely make the interval wide, seed-averaged or not
    a3 = np.stack([b + 0.05 + s for s in (-0.2, 0.0, 0.2)])
    _, qlo, _ = paired_bootstrap(a3.mean(0), b, n=500)
    m, lo, hi = cluster_bootstrap(a3, b[None], np.arange(500), n=500)
    assert qlo > 0 and m == pytest.approx(0.05) and lo < 0 < hi
    # undefined questions are left out; shapes are checked
    a_nan = x.copy()
    a_nan[:100] = np.nan
    assert cluster_bootstrap(a_nan, a_nan, clusters, n=50) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="one value per question"):
        cluster_bootstrap(x, x[:10], clusters)
