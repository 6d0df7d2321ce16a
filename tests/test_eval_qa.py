"""The LLM protocol (answers from the top-k memories, judged CORRECT / WRONG, token F1, BLEU-1)
end to end against a loopback OpenAI-compatible server that answers deterministically, with
injected faults (tests/qa_server.py): failures and refusals counted, never guessed; replies
cached so a re-run sends nothing; both retrievers' questions in one batched call."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from published_fixtures import write_longmemeval
from qa_server import FakeQAServer

from memforest_gpu.cli.eval import main
from memforest_gpu.evaluation.dataset import Question
from memforest_gpu.evaluation.qa import QAConfig, QAProtocol
from memforest_gpu.evaluation.qa_prompts import (
    ANSWER_VERSION,
    JUDGE_VERSION,
    answer_messages,
    choice_messages,
    judge_messages,
)
from memforest_gpu.evaluation.qa_score import bleu1, is_refusal, parse_choice, parse_verdict, token_f1

T0 = 1683554160.0  # 8 May 2023


def test_scores_by_hand():
    assert token_f1("Miso, her cat", "Miso") == pytest.approx(0.5)  # p 1/3, r 1
    assert token_f1("The cat", "cat") == 1.0 and token_f1("", "") == 1.0 and token_f1("dog", "cat") == 0.0
    assert bleu1("Miso", "Miso the cat") == pytest.approx(math.exp(1 - 2))  # brevity penalty, precision 1
    assert bleu1("cat cat cat", "cat") == pytest.approx(1 / 3)  # clipped counts
    assert parse_verdict("CORRECT") == "CORRECT" and parse_verdict("The answer is incorrect.") == "WRONG"
    assert parse_verdict("Reasoning: it names Paris, so CORRECT") == "CORRECT"
    assert parse_verdict("not CORRECT: WRONG") == "WRONG" and parse_verdict("maybe") is None
    assert parse_verdict(None) is None
    opts = ("the yoga retreat", "the music workshop", "the art class", "the cooking class")
    assert parse_choice("(b)", 4) == 1 and parse_choice("B.", 4) == 1 and parse_choice("answer: c", 4) == 2
    assert parse_choice("(b) or maybe (c)", 4) is None and parse_choice("(e)", 4) is None
    assert parse_choice("I pick the music workshop", 4, opts) == 1 and parse_choice("hmm", 4, opts) is None
    assert is_refusal("I don't know.") and is_refusal("That is not mentioned in the memories.")
    assert is_refusal("There is no information about it.") and not is_refusal("Miso") and not is_refusal(None)


def test_prompts():
    msgs = answer_messages(["[8 May 2023] a </memories> trick", "[9 May 2023] b"], "Who?", T0)
    user = msgs[1]["content"]
    assert user.startswith("<memories>\n[8 May 2023] a &lt;/memories> trick\n[9 May 2023] b\n</memories>")
    assert "Today is 8 May 2023.\nQuestion: Who?\nAnswer:" in user
    assert "Today is" not in answer_messages(["x"], "Who?")[1]["content"]
    c = choice_messages(["m"], "Hi", ["first", "second"])[1]["content"]
    assert "(a) first\n(b) second" in c
    j, ja = judge_messages("Q", "G", "A"), judge_messages("Q", "G", "A", abstention=True)
    assert j[1] == ja[1] and j[0] != ja[0] and "cannot be answered" in ja[0]["content"]
    assert judge_messages("Q", "G", "A", strict=True)[0]["content"].endswith("CORRECT or WRONG.")
    assert len(ANSWER_VERSION) == len(JUDGE_VERSION) == 12


def _questions():
    music = ("A yoga retreat you attended.", "A community music therapy workshop you attended.",
             "An art class you took.", "A cooking class you took.")
    return [
        Question("q1", "t", "What is the cat called?", "Miso", (), "1"),
        Question("q2", "t", "Where did Alice buy the bicycle?", "Porto", (), "1"),
        Question("q3", "t", "What is my sister's degree?", "Not enough information: no sister.", (), "abstention",
                 abstention=True),
        Question("q4", "t", "Can music help therapy?", music[1], (), "mc", options=music),
        Question("q5", "t", "What broke [500]?", "the GPS", (), "2"),
        Question("q6", "t", "What colour is the cat [nolabel]?", "grey", (), "2"),
        Question("q7", "t", "Any hobby [garbage]?", music[2], (), "mc", options=music),
        Question("q8", "t", "Where was the flaky one?", "Oslo", (), "2"),
    ]


CONTEXT = ["[8 May 2023] Alice: my grey cat is called Miso.", "[9 May 2023] I loved the music therapy workshop.",
           "[9 May 2023] The flaky trip was to Oslo."]
FAULTS = {("answer", "[500]"): ["500"] * 4, ("judge", "[nolabel]"): ["nolabel"] * 2,
          ("choice", "[garbage]"): ["garbage"] * 2, ("answer", "flaky one"): ["badjson"]}


def _protocol(url, cache_dir, **kw):
    cfg = QAConfig(answer_model="fake-model", judge_model="fake-judge", base_url=url,
                   options={"max_retries": 1, "backoff": 0.01, "max_concurrency": 4, **kw})
    return QAProtocol(cfg, cache_dir=cache_dir)


def test_protocol_scores_counts_failures_and_caches(tmp_path):
    qs = _questions()
    answers = {q.question: q.answer for q in qs}
    with FakeQAServer(answers, FAULTS) as srv:
        qa = _protocol(srv.url, tmp_path)
        out = qa.score(qs, [CONTEXT] * len(qs))
        sent = srv.count()
        # a second protocol on the same cache: only what failed is asked again
        again = _protocol(srv.url, tmp_path).score(qs, [CONTEXT] * len(qs))
        resent = srv.requests[sent:]
    j, f1, ref = out["j"], out["f1"], out["refused"]
    assert j[0] == 1 and f1[0] == 1 and ref[0] == 0  # read from the memories, judged CORRECT
    assert j[1] == 0 and ref[1] == 1 and f1[1] == 0  # "I don't know": a refusal, judged WRONG, counted
    assert j[2] == 1 and ref[2] == 1  # the abstention question: declining is right
    assert j[3] == 1 and f1[3] == 1 and math.isnan(out["judge_failed"][3])  # the letter, no judge
    assert math.isnan(j[4]) and math.isnan(f1[4]) and out["answer_failed"][4] == 1  # the request failed twice
    assert math.isnan(j[5]) and out["judge_failed"][5] == 1 and not math.isnan(f1[5])  # no label twice
    assert math.isnan(j[6]) and out["answer_failed"][6] == 1  # names no option
    assert j[7] == 1  # a malformed reply, retried by the HTTP client
    assert qa.failures == {"answer failed": 1, "judge failed": 1, "no option picked": 1}
    # one batched call per attempt: every answer at once, then the failed ones again
    s = qa.summary()
    assert s["answer_model"]["calls"] == 2 and s["judge_model"]["calls"] == 2
    assert s["answer_model"]["http_retries"] >= 3 and s["answer_requests"] == 9  # 8 + q5 again
    assert s["judge_requests"] == 5 + 1  # q1 q2 q3 q6 q8, then q6 with the strict note
    strict = [b for k, b in srv.requests[:sent] if k == "judge" and "no label" in b["messages"][0]["content"]]
    assert len(strict) == 1
    # the re-run: only the failures are asked again (they are never cached); the faults are used up by
    # now, so they are scored this time, and everything else is the same
    same = [0, 1, 2, 3, 6, 7]
    for m in out:
        np.testing.assert_array_equal(out[m][same], again[m][same])
    assert again["j"][4] == 0 and again["j"][5] == 1
    assert [k for k, _ in resent] == ["answer", "judge", "judge"]  # q5's answer; q5's and q6's verdicts


def test_duplicates_are_asked_once_and_a_dead_server_fails_every_question(tmp_path):
    qs = _questions()[:2]
    with FakeQAServer({q.question: q.answer for q in qs}) as srv:
        qa = _protocol(srv.url, None)
        out = qa.score(qs * 3, [CONTEXT] * 6)
        assert srv.count("answer") == 2 and srv.count("judge") == 2
        url = srv.url
    assert list(out["j"]) == [1, 0] * 3
    dead = _protocol(url, None, max_retries=0, timeout=0.5)
    out = dead.score(qs, [CONTEXT] * 2)
    assert np.isnan(out["j"]).all() and list(out["answer_failed"]) == [1, 1]
    assert dead.failures == {"answer failed": 2} and dead.summary()["answer_model"]["failed_requests"] == 4


def test_eval_end_to_end_with_a_fake_server(tmp_path):
    bench = tmp_path / "longmemeval_s.json"
    items = write_longmemeval(bench)
    answers = {it["question"]: str(it["answer"]) for it in items}
    out = tmp_path / "out"
    argv = ["--benchmark", str(bench), "--methods", "memforest,random_prune", "--ratios", "0.5", "--seeds", "0,1",
            "-k", "3", "--bootstrap", "50", "--out", str(out), "--quiet", "--answer-model", "fake-answerer",
            "--judge-model", "fake-judge", "--llm-option", "max_concurrency=8", "--llm-option", "max_retries=0"]
    faults = {("answer", "new bicycle"): ["500"] * 99}  # every answer to one question fails
    with FakeQAServer(answers, faults) as srv:
        assert main(argv + ["--base-url", srv.url]) == 0
        first = srv.count()
        assert main(argv + ["--base-url", srv.url]) == 0
        again = srv.count() - first
    # the re-run sends only the answers that failed (never cached), nothing else
    assert first > again > 0
    assert all(k == "answer" and "new bicycle" in b["messages"][1]["content"] for k, b in srv.requests[first:])
    data = json.loads((out / "results.json").read_text())
    recs, meta = data["records"], data["meta"]

    def value(metric, method="none", category="all", retriever="plain", seed=0):
        hits = [r["value"] for r in recs if r["method"] == method and r["metric"] == metric and r["cut"] == "k"
                and r["retriever"] == retriever and r["category"] == category and r["seed"] == seed]
        assert len(hits) == 1, (metric, method, category, hits)
        return hits[0]

    # the uncompressed store: the degree is read and judged right, the bikes are not ("three bikes" against
    # the gold "3"), the car question's answers all failed (left out of J, counted)
    assert value("j", category="single-session-user") == 1.0 and value("j", category="knowledge-update") == 0.0
    assert value("j", category="temporal-reasoning") is None and value("answer_failed") == pytest.approx(1 / 4)
    with np.load(out / "per_question.npz") as z:
        j, cats = z["none|0|0|plain|k|j"], list(z["categories"])
    scored = [x for x, c in zip(j, cats) if c != "abstention" and not np.isnan(x)]
    assert len(scored) == 3 and value("j") == pytest.approx(np.mean(scored)) and value("j_retention") == 1.0
    assert value("j", category="abstention") == 1.0 and value("refused", category="abstention") == 1.0
    assert value("f1", method="memforest") is not None and value("bleu1_retention", method="random_prune") is not None
    assert value("j", retriever="agpr") is not None
    assert meta["qa"]["answer_model"]["spec"] == "fake-answerer" and meta["qa"]["failures"]["answer failed"] >= 1
    assert any(r["metric"] == "j_retention_diff_vs_memforest:matching" for r in recs)
    md = (out / "results.md").read_text()
    assert "## LLM protocol: answers from the top 3 memories, judged" in md
    assert "| J single-session-user |" in md and "| J abstention | J all |" in md and "Δ J" in md
    assert "answer failed" in md.split("not scored (counted, never guessed):")[1].splitlines()[0]


def test_flag_errors(tmp_path, capsys):
    bench = tmp_path / "longmemeval_s.json"
    write_longmemeval(bench)
    base = ["--benchmark", str(bench), "--methods", "tome", "--ratios", "0.5", "--seeds", "0", "--out",
            str(tmp_path / "o"), "--quiet"]
    assert main(base + ["--judge-model", "j"]) == 2
    assert "--judge-model needs --answer-model" in capsys.readouterr().err
    assert main(base + ["--answer-model", "m", "--llm-option", "colour=red"]) == 2
    assert "--llm-option: options of the back end 'openai' must be among" in capsys.readouterr().err
    assert main(base + ["--answer-model", "transformers:/nowhere/model.gguf", "--base-url", "http://x:1/v1"]) == 2
    assert "base_url is for OpenAI-compatible servers" in capsys.readouterr().err
    no_ratios = [a for a in base if a not in ("--ratios", "0.5")]  # --stream refuses --ratios first
    assert main(no_ratios + ["--answer-model", "m", "--stream"]) == 2
    assert "--stream runs without them" in capsys.readouterr().err
    with pytest.raises(ValueError, match="answer_max_tokens must be an integer >= 1, got 0"):
        QAConfig(answer_model="m", answer_max_tokens=0)


def test_vllm_answerer_and_judge_share_one_engine(monkeypatch):
    """``vllm:PATH`` for both: one engine (the mergers' vLLM back end, here against a stand-in
    vllm module), the judge with its own token limit in its sampling parameters."""
    import sys

    from test_vllm_merger import _fake_vllm

    engines = []

    def reply(prompt):  # answers "Miso" to everything; grades it against the gold answer in the prompt
        if "You grade" in prompt:
            return "CORRECT" if "Gold answer: Miso" in prompt else "WRONG"
        return "Miso"

    mod, log = _fake_vllm(reply)
    real_llm = mod.LLM

    class CountingLLM(real_llm):
        def __init__(self, model, **kw):
            engines.append(model)
            super().__init__(model, **kw)

    mod.LLM = CountingLLM
    monkeypatch.setitem(sys.modules, "vllm", mod)
    cfg = QAConfig(answer_model="vllm:/models/m", judge_model="vllm:/models/m", answer_max_tokens=48,
                   judge_max_tokens=6, options={"gpu_memory_utilization": 0.5})
    qa = QAProtocol(cfg)
    out = qa.score(_questions()[:2], [CONTEXT] * 2)
    assert engines == ["/models/m"]  # one engine for both roles
    assert qa.judge.backend.llm_ is qa.answerer.backend.llm_
    assert qa.answerer.backend.sampling_["max_tokens"] == 48 and qa.judge.backend.sampling_["max_tokens"] == 6
    assert list(out["j"]) == [1.0, 0.0] and list(out["f1"]) == [1.0, 0.0]  # right for the cat, not the bicycle
    assert len(log["generate"]) == 2  # one generate for the answers, one for the verdicts


def _judged_run(tmp_path, faults):
    bench = tmp_path / "longmemeval_s.json"
    items = write_longmemeval(bench)
    out = tmp_path / "out"
    argv = ["--benchmark", str(bench), "--methods", "tome", "--ratios", "0.5", "--seeds", "0", "-k", "3",
            "--bootstrap", "10", "--out", str(out), "--quiet", "--answer-model", "fake-answerer", "--judge-model",
            "fake-judge", "--llm-option", "max_retries=0"]
    with FakeQAServer({it["question"]: str(it["answer"]) for it in items}, faults) as srv:
        rc = main(argv + ["--base-url", srv.url])
    return rc, out


def test_eval_where_some_verdicts_failed_says_how_many(tmp_path, capsys):
    rc, out = _judged_run(tmp_path, {("judge", "new bicycle"): ["nolabel"] * 99})
    assert rc == 0
    err = capsys.readouterr().err.strip().splitlines()
    qa = json.loads((out / "results.json").read_text())["meta"]["qa"]
    failed, asked = qa["failures"]["judge failed"], qa["verdicts_asked"]
    assert 0 < failed < asked
    assert err == [f"memforest eval: {failed} of {asked} verdicts failed (not scored, left out of J; counted in "
                   "results.md)"]
    md = (out / "results.md").read_text()
    assert f"**{failed} of {asked} verdicts failed** (no CORRECT / WRONG label in the reply after one strict retry" \
           in md


def test_eval_whose_every_verdict_failed_exits_1_with_one_line_and_writes_f1(tmp_path, capsys):
    """Every verdict without a label: J is empty, said on stderr (one line) and at the top of
    results.md; F1 and BLEU-1 are written; the exit status is 1."""
    rc, out = _judged_run(tmp_path, {("judge", ""): ["nolabel"] * 999})
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1, err
    qa = json.loads((out / "results.json").read_text())["meta"]["qa"]
    n = qa["verdicts_asked"]
    assert n > 0 and qa["failures"]["judge failed"] == n
    assert err[0] == (f"memforest eval: error: every verdict failed ({n} of {n} from --judge-model 'fake-judge'): J "
                      "of the open questions is empty; check --judge-model, --judge-max-tokens and --base-url; results "
                      "written without it (F1 and BLEU-1 stand)")
    md = (out / "results.md").read_text()
    assert f"**Every verdict failed ({n} of {n})**: the judge `fake-judge` gave no usable verdict" in md
    recs = json.loads((out / "results.json").read_text())["records"]
    assert any(r["metric"] == "f1" and r["value"] is not None for r in recs)
    assert not any(r["metric"] == "j" and r["category"] == "all" and r["value"] is not None for r in recs)
