"""The LoCoMo loader (docs/evaluation.md, "The protocol in brief") and the benchmark format."""
from __future__ import annotations

import json
import os
from collections import Counter

import pytest

from memforest_gpu.evaluation.benchmark import load_benchmark, write_benchmark
from memforest_gpu.evaluation.locomo import clean_evidence, load_locomo, parse_locomo_date

DEV = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "locomo_dev5.json")


@pytest.mark.parametrize("raw, want", [
    (["D1:3"], ["D1:3"]),
    (["D8:6; D9:17"], ["D8:6", "D9:17"]),
    (["D9:1 D4:4"], ["D9:1", "D4:4"]),
    (["D:11:26"], ["D11:26"]),
    (["D30:05"], ["D30:5"]),
    (["D"], []),
    (["D2:1", "D2:1"], ["D2:1"]),
    ("D3:4", ["D3:4"]),
])
def test_clean_evidence(raw, want):
    assert clean_evidence(raw) == want


def test_parse_date():
    assert parse_locomo_date("1:56 pm on 8 May, 2023") == 1683554160.0
    assert parse_locomo_date("10:37 am on 27 June, 2023") - parse_locomo_date("12:00 am on 27 June, 2023") == 38220
    with pytest.raises(ValueError, match="session date must look like"):
        parse_locomo_date("yesterday")


def _tiny_locomo(path):
    sample = {
        "sample_id": "conv-x",
        "conversation": {
            "speaker_a": "Ann", "speaker_b": "Bo",
            "session_2_date_time": "9:00 am on 9 May, 2023",
            "session_2": [{"speaker": "Bo", "dia_id": "D2:1", "text": "Later."}],
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Ann", "dia_id": "D1:1", "text": "Hi!"},
                {"speaker": "Bo", "dia_id": "D1:2", "text": "Look.", "blip_caption": "a photo of a dog",
                 "img_url": ["x"]},
            ],
        },
        "qa": [
            {"question": "q1", "answer": 2022, "evidence": ["D1:2; D2:1"], "category": 2},
            {"question": "q2", "answer": "a", "evidence": ["D:1:1", "D7:7", "D"], "category": 4},
            {"question": "adv", "adversarial_answer": "x", "evidence": ["D1:1"], "category": 5},
        ],
    }
    with open(path, "w") as f:
        json.dump([sample], f)


def test_tiny_locomo_conversion(tmp_path):
    p = tmp_path / "tiny.json"
    _tiny_locomo(p)
    b = load_locomo(str(p))
    ids = [n["id"] for n in b.nodes]
    assert ids == ["conv-x:D1:1", "conv-x:D1:2", "conv-x:D2:1"]  # sessions in number order
    assert b.nodes[1]["text"] == "Bo: Look. [shares a photo: a photo of a dog]"
    assert b.nodes[0]["text"] == "Ann: Hi!"
    assert b.nodes[1]["timestamp"] == b.nodes[0]["timestamp"] + 1 == 1683554161.0
    assert {n["tenant"] for n in b.nodes} == {"conv-x"}
    assert [q.question for q in b.questions] == ["q1", "q2"]  # category 5 skipped
    assert b.questions[0].answer == "2022" and b.questions[0].category == "2"
    assert b.questions[0].evidence == ("conv-x:D1:2", "conv-x:D2:1")
    assert b.questions[1].evidence == ("conv-x:D1:1",)  # D7:7 and "D" match no turn: dropped
    assert b.info["evidence_ids_dropped"] == 2
    # round trip through the benchmark format
    write_benchmark(b, str(tmp_path / "bench"))
    b2 = load_benchmark(str(tmp_path / "bench"))
    assert b2.questions == b.questions
    assert [n["text"] for n in b2.nodes] == [n["text"] for n in b.nodes]
    assert load_benchmark(str(p)).questions == b.questions  # a .json path is read as LoCoMo


def test_tiny_locomo_as_facts(tmp_path):
    p = tmp_path / "tiny.json"
    _tiny_locomo(p)
    data = json.loads(p.read_text())
    data[0]["observation"] = {
        "session_2_observation": {"Bo": [["Bo left later.", "D2:1"]]},
        "session_1_observation": {  # Bo is listed first, but Ann's fact comes from the earlier turn
            "Bo": [["Bo has a dog.", "D1:2"], ["Bo likes dogs.", []]],
            "Ann": [["Ann greeted Bo.", ["D:1:1"]]]},
    }
    data[0]["qa"].append({"question": "q3", "answer": "x", "evidence": ["D2:2"], "category": 1})
    data[0]["conversation"]["session_2"].append({"speaker": "Ann", "dia_id": "D2:2", "text": "Bye."})
    p.write_text(json.dumps(data))
    b = load_locomo(str(p), nodes="facts")
    assert [(n["id"], n["text"]) for n in b.nodes] == [
        ("conv-x:s1:0", "Ann greeted Bo."), ("conv-x:s1:1", "Bo has a dog."),
        ("conv-x:s1:2", "Bo likes dogs."),  # cites no turn: stays after the fact listed before it
        ("conv-x:s2:0", "Bo left later.")]
    t1 = parse_locomo_date("1:56 pm on 8 May, 2023")
    assert [n["timestamp"] for n in b.nodes] == [t1, t1 + 1, t1 + 2, parse_locomo_date("9:00 am on 9 May, 2023")]
    assert b.nodes[1]["metadata"] == {"session": 1, "speaker": "Bo", "turns": ["D1:2"]}
    assert {n["tenant"] for n in b.nodes} == {"conv-x"}
    q = {x.question: x for x in b.questions}
    assert q["q1"].evidence == ("conv-x:s1:1", "conv-x:s2:0")  # every fact citing D1:2 or D2:1
    assert q["q2"].evidence == ("conv-x:s1:0",)
    assert q["q3"].evidence == ()  # no fact cites D2:2: kept, for AnsR only
    assert b.info["questions_without_evidence"] == 1 and b.info["questions_evidence_uncited"] == 1
    assert b.info["evidence_turns_uncited"] == 1 and b.name == "tiny_facts"
    assert [x.question for x in load_locomo(str(p)).questions] == ["q1", "q2", "q3"]  # same questions as turns
    with pytest.raises(ValueError, match=r"nodes must be one of \['turns', 'facts'\], got 'sessions'"):
        load_locomo(str(p), nodes="sessions")
    with pytest.raises(ValueError, match="turns_per_node must be 1 with nodes='facts', got 4"):
        load_locomo(str(p), nodes="facts", turns_per_node=4)


def test_benchmark_folder_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_benchmark(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="must hold one of"):
        load_benchmark(str(tmp_path / "empty"))


@pytest.mark.skipif(not os.path.exists(DEV), reason="LoCoMo dev file not present (../shared/data)")
def test_dev_file_counts():
    b = load_locomo(DEV)
    assert len(b.nodes) == 2760
    assert len(b.questions) == 762
    assert Counter(q.category for q in b.questions) == {"1": 142, "2": 156, "3": 46, "4": 418}
    assert len({n["tenant"] for n in b.nodes}) == 5
    assert len({n["id"] for n in b.nodes}) == 2760
    # ids and time order inside each tenant
    by_t = {}
    for n in b.nodes:
        by_t.setdefault(n["tenant"], []).append(n["timestamp"])
    assert all(ts == sorted(ts) and len(set(ts)) == len(ts) for ts in by_t.values())
    ids = {n["id"] for n in b.nodes}
    q = {x.question: x for x in b.questions}
    assert q["When did Caroline go to the LGBTQ support group?"].evidence == ("conv-26:D1:3",)
    # every kept evidence id is a turn of the question's own tenant; "D:11:26" is read as D11:26
    assert all(e in ids and e.startswith(x.tenant + ":") for x in b.questions for e in x.evidence)
    assert "conv-43:D11:26" in {e for x in b.questions for e in x.evidence}
    assert b.info["evidence_ids_dropped"] == 2  # "D10:19" (no such turn) and "D" in the dev file


@pytest.mark.skipif(not os.path.exists(DEV), reason="LoCoMo dev file not present (../shared/data)")
def test_dev_file_as_facts_counts():
    b = load_locomo(DEV, nodes="facts")
    turns = load_locomo(DEV)
    assert len(b.nodes) == 1210 and len({n["id"] for n in b.nodes}) == 1210
    same = [(q.id, q.answer, q.category) for q in turns.questions]
    assert [(q.id, q.answer, q.category) for q in b.questions] == same
    assert b.info["questions_without_evidence"] == 131  # 129 whose turns no fact cites, 2 without turns
    assert b.info["questions_evidence_uncited"] == 129 and b.info["evidence_turns_uncited"] == 242
    ids = {n["id"]: n for n in b.nodes}
    assert all(e in ids and e.startswith(x.tenant + ":") for x in b.questions for e in x.evidence)
    by_t = {}
    for n in b.nodes:
        by_t.setdefault(n["tenant"], []).append(n["timestamp"])
    assert all(ts == sorted(ts) and len(set(ts)) == len(ts) for ts in by_t.values())
    q = {x.question: x for x in b.questions}["When did Caroline go to the LGBTQ support group?"]
    assert [ids[e]["text"] for e in q.evidence] == [
        "Caroline attended an LGBTQ support group recently and found the transgender stories inspiring."]


def test_results_header_reports_questions_without_evidence():
    from memforest_gpu.evaluation.result_files import _evidence_counts

    meta = {"questions_without_evidence": 131, "questions_evidence_uncited": 129, "evidence_turns_uncited": 242}
    assert _evidence_counts(meta) == (" 131 questions have no evidence node (129 whose evidence turns no fact cites): "
                                      "they count for AnsR and AnsR-c, not for EvR; 242 evidence turn ids are cited by "
                                      "no fact.")
    assert _evidence_counts({"questions_without_evidence": 0}) == ""
