"""PersonaMem read as published (questions CSV + shared contexts JSONL, fixtures in their schema:
tests/published_fixtures.py): one tenant per (context, end index), the messages before the
end, the options, and the retrieval measures that make sense without an LLM."""
from __future__ import annotations

import csv
import json

import pytest
from published_fixtures import CONTEXT_A, CONTEXT_B, personamem_contexts, personamem_rows, write_personamem

from memforest_gpu.cli.eval import main
from memforest_gpu.evaluation.benchmark import load_benchmark
from memforest_gpu.evaluation.metrics import option_tokens
from memforest_gpu.evaluation.personamem import DAY0, contexts_path_for, load_personamem


def test_tenants_nodes_and_options(tmp_path):
    q, c = write_personamem(tmp_path)
    assert contexts_path_for(q) == c
    b = load_benchmark(q)
    assert b.name == "questions_32k" and b.info["contexts"] == 2 and b.info["questions_without_messages"] == 0
    # a tenant per (context, end index): the first and third questions share one
    tenants = [x.tenant for x in b.questions]
    assert tenants == [f"{CONTEXT_A[:12]}@5", f"{CONTEXT_A[:12]}@7", f"{CONTEXT_A[:12]}@5", f"{CONTEXT_B[:12]}@3"]
    # the messages before the end, user and assistant only (the system persona left out)
    msgs = personamem_contexts()[CONTEXT_A]
    a5 = [n for n in b.nodes if n["tenant"] == tenants[0]]
    assert [n["id"] for n in a5] == [f"{tenants[0]}:{i}" for i in range(1, 5)]
    assert a5[0]["text"] == f"user: {msgs[1]['content']}" and a5[1]["text"].startswith("assistant: Therapist:")
    assert [n["timestamp"] for n in a5] == [DAY0 + i for i in range(1, 5)]
    assert len([n for n in b.nodes if n["tenant"] == tenants[1]]) == 6  # up to the 7th message
    assert not any("stopped going" in n["text"] for n in a5)  # nothing after the question's end
    # options without their letters; the answer is the correct one; no evidence is marked
    first = b.questions[0]
    assert len(first.options) == 4 and first.options[2].startswith("Absolutely. I recall you mentioned")
    assert first.answer == first.options[2] and first.evidence == ()
    assert first.category == "recall_user_shared_facts"  # the GitHub release's recalling_facts_mentioned_by_the_user
    assert b.questions[1].answer.startswith("I remember you found the pottery class tedious")


def test_hugging_face_columns_read_the_same(tmp_path):
    (tmp_path / "gh").mkdir()
    (tmp_path / "hf").mkdir()
    gh = load_benchmark(write_personamem(tmp_path / "gh")[0])
    hf = load_benchmark(write_personamem(tmp_path / "hf", hf_columns=True)[0])
    assert gh.questions == hf.questions and gh.nodes == hf.nodes


def test_distinctive_option_tokens():
    opts = ("I recall your music therapy workshop.", "I recall your yoga retreat.", "I recall your art class.")
    assert option_tokens(opts[0], opts) == frozenset({"music", "therapy", "workshop"})
    assert option_tokens("same words", ("same words", "same words")) == frozenset({"same", "words"})


def test_bad_files(tmp_path):
    q, c = write_personamem(tmp_path)
    with pytest.raises(FileNotFoundError, match="PersonaMem contexts not found"):
        load_personamem(q, contexts=str(tmp_path / "nope.jsonl"))
    rows = personamem_rows()

    def write(mutate):
        r = [dict(x) for x in rows]
        mutate(r)
        p = tmp_path / "questions_bad.csv"
        with open(p, "w", newline="", encoding="utf-8") as f:
            w = csv.DictWriter(f, fieldnames=list(r[0]))
            w.writeheader()
            w.writerows(r)
        return str(p)

    with pytest.raises(ValueError, match=r"row 2: correct_answer must be a letter among the 4 options such as "
                                         r"'\(c\)', got '\(e\)'"):
        load_personamem(write(lambda r: r[0].update(correct_answer="(e)")), contexts=c)
    with pytest.raises(ValueError, match=r"row 3: end_index_in_shared_context must be in \[0, 7\], got 99"):
        load_personamem(write(lambda r: r[1].update(end_index_in_shared_context=99)), contexts=c)
    with pytest.raises(ValueError, match="shared_context_id must be a context of"):
        load_personamem(write(lambda r: r[0].update(shared_context_id="ghost")), contexts=c)
    with pytest.raises(ValueError, match="all_options must be a list literal of strings"):
        load_personamem(write(lambda r: r[0].update(all_options="[(a) not quoted")), contexts=c)
    with pytest.raises(ValueError, match="PersonaMem questions must have column 'all_options'"):
        load_personamem(write(lambda r: [x.pop("all_options") for x in r]), contexts=c)
    # a question before any message has nothing to retrieve: dropped, counted
    b = load_personamem(write(lambda r: r[3].update(end_index_in_shared_context=1)), contexts=c)
    assert len(b.questions) == 3 and b.info["questions_without_messages"] == 1
    (tmp_path / "bad.jsonl").write_text(json.dumps({"a": [], "b": []}) + "\n")
    with pytest.raises(ValueError, match=r"line 1 must be one object \{context id: \[messages\]\}, got dict with 2"):
        load_personamem(q, contexts=str(tmp_path / "bad.jsonl"))


def test_eval_without_an_llm_gives_answer_recall_not_evidence(tmp_path):
    q, c = write_personamem(tmp_path)
    out = tmp_path / "out"
    assert main(["--benchmark", q, "--contexts", c, "--methods", "memforest,kmeans_prune", "--ratios", "0.5",
                 "--seeds", "0", "-k", "2", "--bootstrap", "50", "--out", str(out), "--quiet"]) == 0
    data = json.loads((out / "results.json").read_text())
    assert data["meta"]["multiple_choice"] == 4

    def value(metric, method="none"):
        return next(r["value"] for r in data["records"] if r["method"] == method and r["metric"] == metric
                    and r["cut"] == "B" and r["retriever"] == "plain" and r["category"] == "all")

    assert value("evr") is None  # no evidence marked: not defined
    assert 0 < value("ansr") <= 1 and value("ansr_retention", "kmeans_prune") is not None
    md = (out / "results.md").read_text()
    assert "4 multiple-choice questions: AnsR counts the correct option's distinctive tokens" in md
    assert "LLM protocol" not in md


def _rows_csv(path, rows, hf: bool = False) -> str:
    with open(path, "w", newline="", encoding="utf-8") as f:
        cols = [("user_question_or_message" if hf and k == "question" else k) for k in rows[0]]
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows([{("user_question_or_message" if hf and k == "question" else k): v for k, v in r.items()}
                     for r in rows])
    return str(path)


def test_the_two_releases_question_types_are_reported_under_one_name(tmp_path):
    """GitHub's recalling_facts_mentioned_by_the_user and Hugging Face's recall_user_shared_facts (and
    the other six pairs) are one category; an unknown name is kept and listed."""
    from memforest_gpu.evaluation.personamem import QUESTION_TYPES

    q, c = write_personamem(tmp_path)
    github = {"recalling_facts_mentioned_by_the_user": "recall_user_shared_facts",
              "recalling_the_latest_user_preferences": "acknowledge_latest_user_preferences",
              "recommendation_aligned_with_users_latest_preferences": "provide_preference_aligned_recommendations"}
    gh = load_personamem(q, contexts=c)
    assert [x.category for x in gh.questions] == [github[r["question_type"]] for r in personamem_rows()]
    hf_names = ["recall_user_shared_facts", "acknowledge_latest_user_preferences", "track_full_preference_evolution",
                "unheard_of_type"]
    rows = [{**r, "question_type": t} for r, t in zip(personamem_rows(), hf_names)]
    hf = load_personamem(_rows_csv(tmp_path / "questions_hf.csv", rows, hf=True), contexts=c)
    assert [x.category for x in hf.questions] == hf_names
    assert hf.info["question_types_unknown"] == ["unheard_of_type"] and "question_types_unknown" not in gh.info
    assert len(set(QUESTION_TYPES.values())) == 7 and set(QUESTION_TYPES.values()) <= set(QUESTION_TYPES)


def test_skip_missing_contexts_evaluates_the_others_and_counts_them(tmp_path, capsys):
    q, c = write_personamem(tmp_path)
    rows = personamem_rows()
    rows[1]["shared_context_id"] = rows[3]["shared_context_id"] = "ghost-context"
    path = _rows_csv(tmp_path / "questions_32k.csv", rows)
    out = tmp_path / "out"
    argv = ["--benchmark", path, "--methods", "kmeans_prune", "--ratios", "0.5", "--seeds", "0", "-k", "2",
            "--bootstrap", "10", "--out", str(out), "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "row 3: shared_context_id must be a context of" in err and "got 'ghost-context' (2 of 4 questions" in err
    assert "--skip-missing-contexts evaluates the others" in err and not out.exists()
    b = load_personamem(path, skip_missing_contexts=True)
    assert [x.id for x in b.questions] == ["fixture-q1", "fixture-q3"]
    assert b.info["questions_skipped_missing_context"] == 2 and b.info["contexts_missing"] == 1
    assert main(argv + ["--skip-missing-contexts"]) == 0
    err = capsys.readouterr().err
    assert "2 question(s) skipped (--skip-missing-contexts): their shared_context_id is one of 1 context(s)" in err
    data = json.loads((out / "results.json").read_text())
    assert data["meta"]["questions"] == 2 and data["meta"]["questions_skipped_missing_context"] == 2
    assert "**2 questions skipped** (--skip-missing-contexts)" in (out / "results.md").read_text()
