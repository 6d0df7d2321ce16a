"""LongMemEval read as published (a fixture in its schema, tests/published_fixtures.py): one
tenant per item, nodes per turn or per session, evidence from has_answer or the answer session
ids, abstention questions apart, the question types as categories, end to end in `eval`."""
from __future__ import annotations

import json

import numpy as np
import pytest
from published_fixtures import longmemeval_items, write_longmemeval

from memforest_gpu.cli.eval import main
from memforest_gpu.evaluation.benchmark import load_benchmark, read_questions, write_benchmark
from memforest_gpu.evaluation.longmemeval import load_longmemeval, parse_lme_date


@pytest.fixture
def lme(tmp_path):
    path = tmp_path / "longmemeval_s.json"
    write_longmemeval(path)
    return path


def test_turns_tenants_ids_dates_and_evidence(lme):
    b = load_benchmark(str(lme))
    items = longmemeval_items()
    assert b.name == "longmemeval_s" and b.info["nodes_shape"] == "turns"
    assert {n["tenant"] for n in b.nodes} == {it["question_id"] for it in items}
    # one node per turn, ids by session position and turn, text "role: content", date + turn seconds
    first = items[0]
    nodes = [n for n in b.nodes if n["tenant"] == "lme_q01"]
    assert len(nodes) == sum(len(s) for s in first["haystack_sessions"])
    n = next(x for x in nodes if x["id"] == "lme_q01:S1:2")
    turn = first["haystack_sessions"][1][2]
    assert n["text"] == f"user: {turn['content']}" and turn["has_answer"]
    assert n["timestamp"] == parse_lme_date("2023/05/22 (Mon) 14:05") + 2
    assert n["metadata"] == {"session": "answer_q01", "role": "user"}
    q = {x.id: x for x in b.questions}
    # evidence: the marked turns, across sessions
    assert q["lme_q01"].evidence == ("lme_q01:S1:2",)
    assert q["lme_q02"].evidence == ("lme_q02:S1:2", "lme_q02:S2:2")
    # no marked turn: every turn of the answer sessions
    assert q["lme_q03"].evidence == tuple(f"lme_q03:S{s}:{t}" for s in (0, 2) for t in range(3))
    assert b.info["questions_evidence_from_sessions"] == 2 and b.info["questions_without_evidence"] == 0
    # categories are the question types; _abs ids are abstention questions, apart
    assert q["lme_q01"].category == "single-session-user" and not q["lme_q01"].abstention
    assert q["lme_q01_abs"].category == "abstention" and q["lme_q01_abs"].abstention
    assert b.info["abstention_questions"] == 1
    # the question date, and a numeric answer read as text
    assert q["lme_q01"].date == parse_lme_date("2023/05/30 (Tue) 23:40")
    assert q["lme_q03"].answer == "3"


def test_sessions_shape(lme):
    b = load_benchmark(str(lme), nodes="sessions")
    assert b.name == "longmemeval_s_sessions" and len(b.nodes) == sum(
        len(it["haystack_sessions"]) for it in longmemeval_items())
    s = next(n for n in b.nodes if n["id"] == "lme_q01:S1")
    assert s["text"].splitlines()[2].startswith("user: I graduated") and s["metadata"]["turns"] == 4
    assert s["timestamp"] == parse_lme_date("2023/05/22 (Mon) 14:05")
    q = {x.id: x for x in b.questions}
    assert q["lme_q02"].evidence == ("lme_q02:S1", "lme_q02:S2")
    assert q["lme_q03"].evidence == ("lme_q03:S0", "lme_q03:S2")


def test_oracle_order_comes_from_dates(tmp_path):
    """The oracle file lists sessions unsorted: the store orders them by date."""
    items = longmemeval_items()[:1]
    it = items[0]
    for key in ("haystack_sessions", "haystack_dates", "haystack_session_ids"):
        it[key] = it[key][::-1]
    path = tmp_path / "longmemeval_oracle.json"
    write_longmemeval(path, items)
    b = load_longmemeval(str(path))
    st = b.store(embedder=_Unit())
    ts = st.timestamps.tolist()
    by_session = {}
    for n, t in zip(b.nodes, ts):
        by_session.setdefault(n["metadata"]["session"], []).append(t)
    assert max(by_session["filler_a"]) < min(by_session["answer_q01"]) < min(by_session["filler_b"])


def test_round_trip_through_the_folder_format(lme, tmp_path):
    b = load_benchmark(str(lme))
    write_benchmark(b, str(tmp_path / "folder"))
    back = read_questions(str(tmp_path / "folder" / "questions.jsonl"))
    assert back == b.questions  # date, abstention and evidence survive
    assert load_benchmark(str(tmp_path / "folder")).questions == b.questions


def test_bad_files(tmp_path):
    def write(items):
        p = tmp_path / "longmemeval_x.json"
        p.write_text(json.dumps(items))
        return str(p)

    good = longmemeval_items()[0]
    with pytest.raises(ValueError, match="item 0 is missing required field 'haystack_dates'"):
        load_longmemeval(write([{k: v for k, v in good.items() if k != "haystack_dates"}]))
    with pytest.raises(ValueError, match=r"session 1: date must look like '2023/05/20 \(Sat\) 02:21', got '20 May'"):
        load_longmemeval(write([{**good, "haystack_dates": [good["haystack_dates"][0], "20 May",
                                                            good["haystack_dates"][2]]}]))
    with pytest.raises(ValueError, match="one entry per session, got 3, 2 and 3"):
        load_longmemeval(write([{**good, "haystack_dates": good["haystack_dates"][:2]}]))
    with pytest.raises(ValueError, match="question_id must be unique, got 'lme_q01' twice"):
        load_longmemeval(write([good, good]))
    with pytest.raises(ValueError, match=r"nodes must be one of \['turns', 'sessions'\] for LongMemEval, got 'facts'"):
        load_longmemeval(write([good]), nodes="facts")


def test_subset_by_tenant_and_question_count(lme):
    b = load_benchmark(str(lme))
    s = b.subset(tenants=["lme_q01", "lme_q03"])
    assert {n["tenant"] for n in s.nodes} == {"lme_q01", "lme_q03"} and [q.id for q in s.questions] == [
        "lme_q01", "lme_q03"]
    assert [q.id for q in b.subset(max_questions=2).questions] == ["lme_q01", "lme_q01_abs"]  # i * 5 // 2
    with pytest.raises(ValueError, match=r"tenants must be tenants of benchmark 'longmemeval_s', got unknown \['x'\]"):
        b.subset(tenants=["x"])


def test_eval_reports_question_types_and_abstention_apart(lme, tmp_path):
    out = tmp_path / "out"
    assert main(["--benchmark", str(lme), "--methods", "memforest,tome", "--ratios", "0.5", "--seeds", "0",
                 "-k", "3", "--max-tokens", "40", "--bootstrap", "50", "--out", str(out), "--quiet"]) == 0
    data = json.loads((out / "results.json").read_text())
    meta, recs = data["meta"], data["records"]
    assert meta["categories_apart"] == ["abstention"] and meta["tenants"] == 5
    cats = {r["category"] for r in recs if r["metric"] == "ansr"}
    assert cats == {"single-session-user", "temporal-reasoning", "knowledge-update", "multi-session", "abstention",
                    "all"}
    # "all" is the mean over the four answerable questions, never the abstention one
    with np.load(out / "per_question.npz") as z:
        per_q, qcats = z["none|0|0|plain|B|ansr"], list(z["categories"])
    mask = np.array([c != "abstention" for c in qcats])
    rec = next(r for r in recs if r["method"] == "none" and r["metric"] == "ansr" and r["cut"] == "B"
               and r["retriever"] == "plain" and r["category"] == "all")
    assert rec["value"] == pytest.approx(float(np.nanmean(per_q[mask])))
    assert float(np.nanmean(per_q[mask])) != pytest.approx(float(np.nanmean(per_q)))
    md = (out / "results.md").read_text()
    assert "AnsR@B temporal-reasoning" in md and "Categories abstention (abstention questions) are reported apart" in md
    # the abstention column comes last
    head = next(line for line in md.splitlines() if line.startswith("| Method |"))
    assert head.index("AnsR@B abstention") > head.index("AnsR@B single-session-user")


class _Unit:
    """A constant embedder: only the store's order matters here."""

    name, dim, max_tokens = "unit", 4, 256

    def embed(self, texts):
        import torch

        return torch.nn.functional.normalize(torch.ones(len(list(texts)), 4), dim=1)
