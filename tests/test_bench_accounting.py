"""The benchmark tools that before/after claims rest on: the stage accounting
(bench/accounting.py) and the revision comparison (bench/compare.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
sys.path.insert(0, BENCH)

import accounting  # noqa: E402
import compare  # noqa: E402

from memforest_gpu import CompressConfig, compress  # noqa: E402
from memforest_gpu.store.synthetic import synthetic_store  # noqa: E402


def test_the_counter_books_products_and_bytes_to_the_stage_that_runs_them():
    a, b = torch.randn(3, 8, 16), torch.randn(3, 16, 5)
    x = torch.randn(1000)
    timer = accounting.timer_mod.StageTimer()

    def work():
        with timer.stage("plan"):
            torch.bmm(a, b)
            x.mul(2.0)  # 4,000 bytes read, 4,000 written
        with timer.stage("apply"):
            torch.mm(a[0], b[0])

    c = accounting.count_stages(work)
    assert c.flops["plan"] == 2 * 3 * 8 * 5 * 16 and c.flops["apply"] == 2 * 8 * 5 * 16
    assert c.bytes["plan"] == 8000 and c.bytes.get("apply", 0) == 0
    assert list(c.shapes["plan"]) == [("bmm", (3, 8, 16, 5), "float32")]


def test_accounting_of_a_small_compression_covers_its_stages():
    store = synthetic_store(600, tenants=2, dim=16, seed=3)
    cfg = CompressConfig.preset("memforest")
    res = compress(store, cfg)
    acc = accounting.account(accounting.count_stages(lambda: compress(store, cfg)), res.report.seconds, "cpu")
    stages = {k for k, v in acc.items() if isinstance(v, dict)}
    assert {"partition", "setup", "plan", "apply"} <= stages
    assert acc["setup"]["gflop"] > 0 and acc["plan"]["gbytes"] > 0  # the knn graph's products, the forest's sorts
    assert all(v["floor_s"] >= 0 for k, v in acc.items() if isinstance(v, dict))
    text = accounting.format_accounting(acc)
    assert "setup" in text and "%mm" in text
    ts = accounting.text_stages(res.report.seconds, res.merges, res.store.texts)
    assert ts["merge"]["floor_us"] > 0 and ts["merge"]["us_per_merge"] > ts["merge"]["floor_us"]


def test_compare_reads_the_figures_of_json_lines_and_prints_per_metric_ratios():
    out = "\n".join(["# a comment", json.dumps({"name": "matching", "n": 10, "best_seconds": 2.0,
                                                "stages": {"plan": 1.0, "merge": {"seconds": 0.5}}, "rounds": 3}),
                     "not json {", json.dumps({"preset": "paper", "peak_mb": 100.0, "flag": True})])
    m = compare.metrics(out)
    assert m == {"matching/10:best_seconds": 2.0, "matching/10:stages.plan": 1.0, "matching/10:stages.merge": 0.5,
                 "paper:peak_mb": 100.0}
    table = compare.table([{"x_s": 2.0, "only_a_s": 1.0}, {"x_s": 4.0}], [{"x_s": 1.0}, {"x_s": 4.0}], "A", "B")
    row = next(line for line in table.splitlines() if line.startswith("x_s"))
    assert row.split()[3:] == ["0.750", "0.500", "1.000"]  # median, min and max of B/A over the pairs
    assert next(line for line in table.splitlines() if line.startswith("only_a_s")).split()[2] == "-"


def test_compare_refuses_a_revision_that_does_not_exist():
    r = subprocess.run([sys.executable, os.path.join(BENCH, "compare.py"), "no-such-rev", "HEAD", "--", "true"],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode != 0 and "'no-such-rev' is not a revision" in (r.stdout + r.stderr)
