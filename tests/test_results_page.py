"""docs/results/README.md is bench/results.py's rendering of docs/results/records/: no figure on
it is edited by hand, every record states its machine, date, command and source, and the
renderer reads memforest eval's results.json and bench/compare.py's --json as they are written."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_results", ROOT / "bench" / "results.py")
results = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(results)


def _record(**over) -> dict:
    rec = {"format": results.FORMAT, "title": "a run", "section": "speed", "command": "python bench/small.py",
           "machine": "a test machine", "date": "2026-01-02", "source": {"kind": "measured"},
           "table": {"columns": ["a", "b"], "rows": [[1, 2.5]]}}
    return {**rec, **over}


def test_the_committed_page_is_the_rendering_of_the_records():
    page = (ROOT / "docs" / "results" / "README.md").read_text(encoding="utf-8")
    assert page == results.render(results.load_records()), \
        "docs/results/README.md differs from its records: run `python bench/results.py` (never edit the page)"


def test_every_record_names_machine_date_command_and_source():
    recs = results.load_records()  # checks each
    assert recs
    for rid, r in recs:
        assert r["machine"] and r["date"] and r["command"], rid
        if r["source"]["kind"] == "transcribed":
            assert (ROOT / r["source"]["page"]).suffix == ".md", rid


@pytest.mark.parametrize("bad, words", [
    ({"machine": ""}, "machine"),
    ({"date": "3 Dec"}, "date"),
    ({"source": {"kind": "transcribed", "page": "docs/performance.md"}}, "revision"),
    ({"source": {}}, "source.kind"),
    ({"command": []}, "command"),
    ({"eval": {"records": []}}, "exactly one"),
    ({"table": {"columns": ["a"], "rows": [[1, 2]]}}, "do not have"),
])
def test_a_record_that_cannot_be_stated_honestly_is_refused(bad, words):
    with pytest.raises(results.RecordError, match=words):
        results.check_record("x.json", _record(**bad))


def test_machine_and_date_are_stated_once_per_group():
    recs = [("a", _record(title="first")), ("b", _record(title="second", order=1)),
            ("c", _record(title="older", date="2025-12-31"))]
    page = results.render(recs)
    assert page.count("**Machine:** a test machine. **Date:** 2026-01-02.") == 1
    assert page.index("first") < page.index("second") < page.index("older")  # newest group first
    assert "| 1 | 2.5 |" in page


def test_a_memforest_eval_results_json_renders_as_a_table():
    recs = []
    for method, sched, ratio, seed, metric, value in [
            ("none", "-", 0.0, 0, "ansr", 0.5), ("memforest", "matching", 0.5, 0, "ansr_retention", 0.97),
            ("memforest", "matching", 0.5, 1, "ansr_retention", 0.95), ("memforest", "matching", 0.7, 0,
                                                                         "ansr_retention", 0.9),
            ("tome", "-", 0.5, 0, "ansr_retention", 0.91), ("tome", "-", 0.5, "mean", "ansr_retention", 0.5)]:
        recs.append({"benchmark": "dev", "method": method, "schedule": sched, "ratio": ratio, "seed": seed,
                     "retriever": "plain", "cut": "B", "metric": metric, "category": "all", "value": value})
    recs.append({**recs[1], "category": "1", "value": 0.1})  # another category: not shown
    recs.append({**recs[1], "retriever": "agpr", "value": 0.2})  # another retriever: not shown
    data = {"meta": {"benchmark": "dev"}, "records": recs}
    cols, rows, notes = results.eval_table(data, {"metrics": ["ansr_retention"]})
    assert cols == ["method", "ratio 0.5", "ratio 0.7"]
    assert rows == [["memforest:matching", "96.0", "90.0"], ["tome", "91.0", "–"]]
    assert "mean over seeds" in notes[0]
    rec = {k: v for k, v in _record(section="quality").items() if k != "table"}
    page = results.render([("ev", {**rec, "eval": data, "view": {"metrics": ["ansr_retention"]}})])
    assert "| memforest:matching | 96.0 | 90.0 |" in page


def test_bench_compare_json_renders_as_a_table():
    data = {"a": {"rev": "A1", "sha": "x", "runs": [{"seconds.total": 10.0}, {"seconds.total": 12.0}]},
            "b": {"rev": "B1", "sha": "y", "runs": [{"seconds.total": 5.0}, {"seconds.total": 9.0}]},
            "command": ["python", "bench/small.py"]}
    cols, rows, _ = results.compare_table(data)
    assert cols[1:3] == ["A = A1", "B = B1"]
    assert rows == [["seconds.total", 11.0, 7.0, "0.625 [0.500, 0.750]"]]


def test_add_eval_records_a_run_and_renders_the_page(tmp_path):
    run = tmp_path / "results.json"
    run.write_text(json.dumps({"meta": {}, "records": [
        {"benchmark": "b", "method": "memforest", "schedule": "matching", "ratio": 0.5, "seed": 0,
         "retriever": "plain", "cut": "B", "metric": "ansr_retention", "category": "all", "value": 0.9}]}))
    (tmp_path / "records").mkdir()
    page = tmp_path / "page.md"
    rc = results.main(["--records", str(tmp_path / "records"), "--page", str(page), "add-eval", str(run),
                       "--id", "dev", "--title", "dev file", "--command", "memforest eval ...",
                       "--machine", "m", "--date", "2026-02-03", "--revision", "abc"])
    assert rc == 0
    rec = json.loads((tmp_path / "records" / "dev.json").read_text())
    assert rec["source"] == {"kind": "measured"} and rec["eval"]["records"][0]["value"] == 0.9
    text = page.read_text()
    assert "**Machine:** m. **Date:** 2026-02-03." in text and "| memforest:matching | 90.0 / – |" in text
    assert results.main(["--records", str(tmp_path / "records"), "--page", str(page), "--check"]) == 0
    page.write_text(text.replace("90.0", "99.0"))  # a figure edited by hand
    assert results.main(["--records", str(tmp_path / "records"), "--page", str(page), "--check"]) == 1
