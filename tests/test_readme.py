"""The README's Python example runs as written, and the demo runs end to end."""
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_python_example(tmp_path, monkeypatch):
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has no python example"
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), ns)
    res = ns["result"]
    assert res.report.nodes_out == 2
    assert sorted(x for s in res.store.sources for x in s) == ["a1", "a2", "a3"]
    assert os.path.exists(tmp_path / "out.parquet")
    assert len(ns["hits"][0]) == 2


def test_readme_names_the_test_command():
    text = (ROOT / "README.md").read_text()
    assert "bash .ci/run" in text
    assert "pytest" in (ROOT / ".ci" / "run").read_text()


def test_demo_runs(tmp_path):
    from memforest_gpu.cli.demo import run_demo

    lines: list[str] = []
    out = run_demo(ratio=0.5, out_dir=str(tmp_path), print_fn=lambda *a: lines.append(" ".join(map(str, a))))
    assert out["nodes_in"] == 388
    # exact per tenant, halves rounded up: alice 129 -> 65, bob 133 -> 67, chen 126 -> 63 removed
    assert out["nodes_out"] == 388 - (65 + 67 + 63)
    text = "\n".join(lines)
    assert "Query for alice" in text and "before:" in text and "after:" in text
    assert (tmp_path / "sample.compressed.parquet").exists()
    # each user's most similar merge is a pair: two memories, then the text merged from them
    pairs = text.split("side by side", 1)[1].split("Query for", 1)[0]
    assert pairs.count("older: [") == pairs.count("newer: [") == pairs.count("merged: [") == 3, pairs
    # the answer after compression shows the part of a merged node that matched, not the memory merged
    # into it that has nothing to do with the query ("Sam's parents are visiting Berlin next month.")
    after = text.split("after:", 1)[1]
    assert "Porto" in after and "Sam's parents" not in after, after
