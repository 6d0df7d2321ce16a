"""bench/gpu.py, the GPU verification run, tested on the CPU before it meets a GPU: the
plain-checkout install, the record schema, the per-step time limit and the rehearsal itself.
(.ci/run runs the whole rehearsal, every step; here a fast subset.)"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import types

import pytest
from extras import need

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
sys.path.insert(0, BENCH)

import gpu  # noqa: E402
from gpu_record import COMMON, RECORDS, STATUSES, append_record, read_records, summary_table  # noqa: E402


def test_rehearsal_with_the_checkout_on_pythonpath_writes_the_same_records(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, os.path.join(BENCH, "gpu.py"), "--rehearse", "--only", "retrieval,optional",
                        "--install", "path", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    recs = read_records(str(out / RECORDS))
    setup = recs[0]
    assert setup["name"] == "install" and setup["method"] == "PYTHONPATH"
    # imported from this checkout itself (no staging), not from the venv
    assert os.path.realpath(setup["package"]) == os.path.join(os.path.realpath(ROOT), "memforest_gpu", "__init__.py")
    for rec in recs:
        assert list(rec)[:len(COMMON)] == list(COMMON), rec
        assert rec["status"] in STATUSES and rec["rehearse"] is True
    by = {r["name"]: r for r in recs}
    for name in ("retrieval_topk_t1", "retrieval_agpr_t1", "retrieval_topk_t4", "retrieval_agpr_t4"):
        assert by[name]["status"] == "ok" and by[name]["qps"] > 0 and by[name]["hits_found"] == 1.0
        assert by[name]["device"] == "cpu"
    if importlib.util.find_spec("vllm") is None:
        assert by["vllm"]["status"] == "skipped" and "not importable" in by["vllm"]["summary"]
    else:  # importable: on the CPU rehearsal it still needs CUDA
        assert by["vllm"]["status"] == "skipped" and "needs CUDA" in by["vllm"]["summary"]
    if importlib.util.find_spec("faiss") is not None:
        # the record reports how many AGPR hits equal the exact search's; a near-tie of
        # similarities may flip a few (faiss and torch round differently), so the bench
        # reports it and the exact check lives in tests/test_index.py (compared by margins)
        for kind in ("faiss-flat", "faiss-ivf"):
            assert by[kind]["status"] == "ok" and 0.9 <= by[kind]["agreement_with_exact"] <= 1.0, by[kind]
    else:
        assert by["faiss"]["status"] == "skipped"
    assert "retrieval_agpr_t4" in r.stdout.split("records in")[-1]  # the summary table


def test_rehearsal_of_the_whole_compress_step(tmp_path):
    """Both presets compress the store whole, with seconds and peaks by stage, reads and copies."""
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, os.path.join(BENCH, "gpu.py"), "--rehearse", "--only", "compress",
                        "--install", "path", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    by = {rec["name"]: rec for rec in read_records(str(out / RECORDS))}
    for preset in ("memforest", "paper"):
        rec = by[f"compress_{preset}"]
        assert rec["status"] == "ok" and rec["n"] == 3000 and rec["shortfall"] == 0 and rec["rounds"] >= 1
        assert rec["kmeans"] == "two-level" and rec["schedule"] == "matching"
        assert {"partition", "setup", "trees", "rounds", "output"} <= set(rec["stages"])
        assert rec["stages"]["partition"]["rss_peak_mb"] > 0 and rec["peak_gpu_mb"] is None  # the CPU
        assert rec["host_reads"] > 0 and rec["h2d_copies"] == 0 and len(rec["reads_per_round"]) == rec["rounds"]


def test_a_step_past_its_limit_leaves_a_timeout_record_and_keeps_the_others(tmp_path):
    records = str(tmp_path / RECORDS)
    append_record(records, step="first_round", name="earlier", summary="written before the kill")
    args = types.SimpleNamespace(out=str(tmp_path), rehearse=True)
    gpu.run_step("first_round", 1.0, args, dict(os.environ), records)  # importing torch alone takes longer
    recs = read_records(records)
    assert [r["name"] for r in recs] == ["earlier", "step"]
    assert recs[1]["status"] == "timeout" and recs[1]["limit_s"] == 1.0
    assert os.path.exists(tmp_path / "logs" / "first_round.log")


def test_records_survive_a_torn_last_line(tmp_path):
    path = str(tmp_path / RECORDS)
    append_record(path, step="kmeans", name="matmul_tf32", tflops=400.0)
    with open(path, "a") as f:
        f.write('{"step": "kmeans", "name": "assign_tri')  # killed mid-write
    recs = read_records(path)
    assert len(recs) == 1 and recs[0]["tflops"] == 400.0
    assert "matmul_tf32" in summary_table(recs)
    with pytest.raises(ValueError, match=r"status must be one of \['ok', 'fail', 'error', 'timeout', 'skipped'\]"):
        append_record(path, step="x", name="y", status="done")


def test_a_plain_checkout_on_pythonpath_imports_the_kernels_from_it(tmp_path):
    """No staging: the committed link memforest_gpu/kernels -> ../kernels makes the checkout importable as it is."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    code = ("import memforest_gpu.kernels.assign as k, json; "
            "print(json.dumps([k.__file__, k.best_match.__module__]))")
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=str(tmp_path), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    where, mod = json.loads(r.stdout)
    assert where == os.path.join(ROOT, "memforest_gpu", "kernels", "assign.py")  # through the link
    assert mod == "memforest_gpu.kernels.assign"
    assert os.path.realpath(where) == os.path.join(os.path.realpath(ROOT), "kernels", "assign.py")


def test_step_limits_fit_the_budget():
    from gpu_steps import SIZES, STEPS

    assert sum(s.limit_s for s in STEPS) <= 480  # 8 minutes on the GPU, setup included by the budget
    assert [s.name for s in STEPS] == ["agreement", "compress", "first_round", "kmeans", "merge", "retrieval",
                                       "optional"]
    assert SIZES["gpu"]["first_round_n"] == SIZES["gpu"]["ret_n"] == 1_000_000 and SIZES["gpu"]["ret_q"] == 10_000
    assert SIZES["gpu"]["compress_n"] == 1_000_000 and SIZES["gpu"]["compress_dim"] == 384
    assert SIZES["gpu"]["lms"] == {"qwen2.5-0.5b": [256, 1024], "qwen2.5-7b": [256]}


def test_environment_yml_is_the_gpu_environment():
    yaml = need("yaml")
    env = yaml.safe_load(open(os.path.join(ROOT, "environment.yml")))
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    names = {d.split("=")[0].split(">")[0] for d in conda}
    assert {"faiss-gpu", "cupy", "cuda-version"} <= names and "conda-forge" in env["channels"]
    pins = dict(p.split("==") for p in pip if "==" in p)
    assert {"torch", "vllm", "transformers", "sentence-transformers"} <= set(pins) and "-e ." in pip
    assert not pins["torch"].startswith("2.13")  # the CPU pin belongs to the README's pip path


def test_fast_store_is_a_valid_memory_like_store():
    import torch
    from gpu_ctx import fast_store, noisy_queries

    from memforest_gpu.store.memory_store import MemoryStore

    st = fast_store(5000, 16, tenants=4, big_share=0.5, seed=3)
    assert len(st) == 5000 and len(set(st.ids)) == 5000 and st.sources == [[i] for i in st.ids]
    sizes = {t: st.tenants.count(t) for t in st.tenant_names()}
    assert sizes["tenant-0"] == 2500 and sum(sizes.values()) == 5000
    torch.testing.assert_close(st.embeddings.norm(dim=1), torch.ones(5000), rtol=0, atol=1e-5)
    assert st.timestamps.dtype == torch.float64 and bool((st.timestamps[1:2500] > st.timestamps[:2499]).all())
    # the same columns through the validating constructor give the same store
    ref = MemoryStore.from_columns(ids=st.ids, texts=st.texts, timestamps=st.timestamps, embeddings=st.embeddings,
                                   tenants=st.tenants)
    torch.testing.assert_close(ref.embeddings, st.embeddings, rtol=0, atol=1e-6)
    assert torch.equal(ref.timestamps, st.timestamps) and ref.tenants == st.tenants
    q, tens = noisy_queries(st, 7)
    assert q.shape == (7, 16) and len(tens) == 7
