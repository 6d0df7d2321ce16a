"""``memforest eval`` on LoCoMo-shaped files with bad content: one line naming the file, the
sample and the field (exit 2), found by a validation pass before any work -- with and without
``--stream`` and ``--nodes facts`` -- never a traceback."""
from __future__ import annotations

import copy
import json
import os

import pytest

from memforest_gpu.cli.commands import main

GOOD = {
    "sample_id": "conv-1",
    "conversation": {
        "speaker_a": "Ann", "speaker_b": "Bob",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": "I moved to Porto."},
                      {"speaker": "Bob", "dia_id": "D1:2", "text": "Nice!", "blip_caption": "a photo of a city"}],
        "session_2_date_time": "10:37 am on 27 June, 2023",
        "session_2": [{"speaker": "Ann", "dia_id": "D2:1", "text": "Porto is rainy."}],
    },
    "observation": {"session_1_observation": {"Ann": [["Ann moved to Porto.", ["D1:1"]]]},
                    "session_2_observation": {"Ann": [["Porto is rainy.", "D2:1"]]}},
    "qa": [{"question": "Where did Ann move?", "answer": "Porto", "evidence": ["D1:1"], "category": 1},
           {"question": "Adversarial", "adversarial_answer": "x", "category": 5}],
}


def _set(path: str, value):
    """An edit of GOOD: ``path`` (``a.b[0].c``; ``None`` value deletes) set to ``value``."""
    def edit(sample):
        keys = [int(k) if k.isdigit() else k for k in path.replace("[", ".").replace("]", "").split(".")]
        node = sample
        for k in keys[:-1]:
            node = node[k]
        if value is _DELETE:
            del node[keys[-1]]
        else:
            node[keys[-1]] = value
        return [sample]
    return edit


_DELETE = object()

# (case, edit of the data, the field the message must name, the shapes that read it)
CASES = [
    ("no sample_id", _set("sample_id", _DELETE), "sample 0: sample_id must be", "all"),
    ("conversation is a number", _set("conversation", 7), "conversation must be an object", "all"),
    ("no conversation", _set("conversation", _DELETE), "conversation must be an object", "all"),
    ("session given as a string", _set("conversation.session_1", "hello"),
     "conversation.session_1 must be a list of turns, got a string 'hello'", "all"),
    ("turn is a string", _set("conversation.session_1[1]", "Bob: hi"), "conversation.session_1[1] must be a turn",
     "all"),
    ("turn without speaker", _set("conversation.session_1[0].speaker", _DELETE),
     "conversation.session_1[0].speaker must be a string, got none", "all"),
    ("text is a number", _set("conversation.session_2[0].text", 5), "conversation.session_2[0].text must be a "
                                                                     "string, got a number 5", "all"),
    ("caption is a list", _set("conversation.session_1[1].blip_caption", ["x"]),
     "conversation.session_1[1].blip_caption must be a string or absent", "all"),
    ("repeated dia_id", _set("conversation.session_2[0].dia_id", "D1:1"),
     "conversation.session_2[0].dia_id must be unique in its sample", "all"),
    ("session without its date", _set("conversation.session_2_date_time", _DELETE),
     "conversation.session_2_date_time must be a date", "all"),
    ("a date that is no date", _set("conversation.session_2_date_time", "yesterday"),
     "conversation.session_2_date_time must be a date like '1:56 pm on 8 May, 2023', got a string 'yesterday'",
     "all"),
    ("qa is an object", _set("qa", {"q": 1}), "qa must be a list of questions", "all"),
    ("question missing", _set("qa[0].question", _DELETE), "qa[0].question must be a string, got none", "all"),
    ("evidence is null", _set("qa[0].evidence", None), "qa[0].evidence must be a dialogue id string or a list",
     "all"),
    ("observation is a list", _set("observation", ["x"]), "observation must be an object", "facts"),
    ("a fact without evidence", _set("observation.session_1_observation.Ann[0]", ["Ann moved."]),
     "observation.session_1_observation.Ann[0] must be a [fact, evidence] pair", "facts"),
    ("a fact that is a number", _set("observation.session_2_observation.Ann[0][0]", 3),
     "observation.session_2_observation.Ann[0][0] must be a non-empty string (the fact)", "facts"),
    ("speaker's facts are a string", _set("observation.session_1_observation.Ann", "moved"),
     "observation.session_1_observation.Ann must be a list of [fact, evidence] pairs", "facts"),
]
MODES = {"plain": [], "stream": ["--stream"], "facts": ["--nodes", "facts"]}


def _run(tmp_path, capsys, data, mode: str):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    out = tmp_path / "out"
    rc = main(["eval", "--benchmark", str(path), "--out", str(out), "--seeds", "0", *MODES[mode]])
    err = capsys.readouterr().err
    assert not out.exists(), "nothing may be written before the input is checked"
    return rc, err, str(path)


RUNS = [(mode, *c) for c in CASES for mode in MODES if c[3] == "all" or mode == "facts"]


@pytest.mark.parametrize("mode, case, edit, field, shapes", RUNS, ids=[f"{r[1]}-{r[0]}" for r in RUNS])
def test_a_bad_locomo_field_is_one_line_naming_file_sample_and_field(tmp_path, capsys, mode, case, edit, field,
                                                                     shapes):
    rc, err, path = _run(tmp_path, capsys, edit(copy.deepcopy(GOOD)), mode)
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    sample = "sample 0" + ("" if case == "no sample_id" else " ('conv-1')")
    assert f"{path}: {sample}: " in err and field in err, err


@pytest.mark.parametrize("case, edit", [(c[0], c[1]) for c in CASES if c[3] == "facts"])
def test_the_turns_do_not_read_the_observation(tmp_path, case, edit):
    from memforest_gpu.evaluation.locomo import load_locomo

    path = tmp_path / "bad.json"
    path.write_text(json.dumps(edit(copy.deepcopy(GOOD))))
    assert len(load_locomo(str(path)).nodes) == 3


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("data, message", [
    ([GOOD, GOOD], "sample 1 ('conv-1'): sample_id must be unique (sample 0 has it too)"),
    ([GOOD, 3], "sample 1: a sample must be an object with 'sample_id' and 'conversation', got a number 3"),
    ([], "must hold a LoCoMo sample (an object) or a non-empty list of them, got a list []"),
    ("conv", "must hold a LoCoMo sample (an object) or a non-empty list of them, got a string 'conv'"),
])
def test_a_bad_file_shape_is_one_line(tmp_path, capsys, mode, data, message):
    rc, err, path = _run(tmp_path, capsys, data, mode)
    assert rc == 2 and message in err and path in err and len(err.strip().splitlines()) == 1, err


def test_a_file_that_is_not_json_names_the_file_and_the_place(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text('[{"sample_id": "c",\n  "conversation": }]')
    assert main(["eval", "--benchmark", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{path} must be LoCoMo JSON, got bad JSON at line 2 column 19" in err, err


def test_nesting_too_deep_is_one_line(tmp_path, capsys):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000)
    assert main(["eval", "--benchmark", str(path), "--out", str(tmp_path / "out")]) == 2
    assert f"{path} must be LoCoMo JSON, got nesting too deep to read" in capsys.readouterr().err


def test_the_good_file_passes_the_check_in_every_shape(tmp_path):
    from memforest_gpu.evaluation.locomo import load_locomo

    path = tmp_path / "good.json"
    path.write_text(json.dumps([GOOD]))
    assert len(load_locomo(str(path)).nodes) == 3
    assert len(load_locomo(str(path), nodes="facts").nodes) == 2
    assert len(load_locomo(str(path), turns_per_node=2).nodes) == 2


@pytest.mark.parametrize("args, message", [
    (["--budgets", "0.5"], "--budgets applies only with --stream, got --budgets 0.5"),
    (["--rerun"], "--rerun applies only with --stream, got --rerun"),
    (["--stream", "--budgets", "abc"], "--budgets must be a comma list of numbers, got 'abc'"),
    (["--ratios", "0.5,x"], "--ratios must be a comma list of numbers, got '0.5,x'"),
    (["--stream", "--nodes", "facts"], "--nodes does not apply to --stream"),
    (["--stream", "--ratios", "0.5"], "--ratios does not apply to --stream"),
    (["--stream", "--tenants", "conv-1"], "--tenants does not apply to --stream"),
    (["--methods", "tome", "--reference", "tomee"], "--reference must be one of the methods run (tome), got 'tomee'"),
])
def test_eval_flags_that_would_be_ignored_or_are_not_numbers_are_refused(tmp_path, capsys, args, message):
    path = tmp_path / "good.json"
    path.write_text(json.dumps([GOOD]))
    assert main(["eval", "--benchmark", str(path), "--out", str(tmp_path / "out"), *args]) == 2
    assert message in capsys.readouterr().err
    assert os.listdir(tmp_path) == ["good.json"]
