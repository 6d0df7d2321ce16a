"""The GPU verification run: one command, every GPU figure, within a fixed wall-clock budget.

    bash bench/gpu.sh                      # on a lent GPU: records in $OUT (default runs/gpu)
    bash bench/gpu.sh --rehearse           # tiny sizes on the CPU: same steps, same records (CI)
    python bench/gpu.py --only first_round,kmeans --budget 200

1. Makes the project importable offline: already installed from this checkout, else
   ``pip install --no-deps --no-build-isolation --no-index -e .``, else the checkout itself
   on ``PYTHONPATH`` (``memforest_gpu/kernels`` is a committed link to ``kernels/``, so a
   plain checkout imports ``memforest_gpu.kernels`` as an install does). Wheels in
   ``bench/wheels/`` are installed first (``--no-index --no-deps``): the GPU image has no
   package registry.
2. Runs each step of :data:`gpu_steps.STEPS` in order of value, each in its own process
   under its own time limit, never past the total ``--budget``. Steps append one record
   per result to ``$OUT/gpu_records.jsonl`` as soon as it exists (:mod:`gpu_record`); a step
   that is killed or crashes loses only itself and gets a ``timeout``/``error`` record.
   Each step's output goes to ``$OUT/logs/<step>.log``.
3. Prints a summary table of every record.

Exit status: 0 when every record is ok or skipped, 1 otherwise.
"""
from __future__ import annotations

import argparse
import glob
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from gpu_record import RECORDS, append_record, read_records, summary_table  # noqa: E402
from gpu_steps import STEPS  # noqa: E402 - names and limits only; imports nothing heavy

PROBE = "import memforest_gpu, memforest_gpu.kernels; print(memforest_gpu.__file__)"
VERSIONS = """
import importlib.metadata as md, json, shutil, subprocess, torch
v = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": None, "driver": None}
for p in ("triton", "transformers", "faiss-gpu", "faiss-cpu", "vllm", "cupy", "numpy"):
    try:
        v[p] = md.version(p)
    except md.PackageNotFoundError:
        v[p] = None
if torch.cuda.is_available():
    v["gpu"] = torch.cuda.get_device_name(0)
    v["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
if shutil.which("nvidia-smi"):
    r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                       text=True, timeout=30)
    v["driver"] = r.stdout.strip() or None
print(json.dumps(v))
"""


def versions(env: dict) -> dict:
    """torch, CUDA, GPU, driver and the optional packages as a fresh interpreter sees them."""
    import json

    r = subprocess.run([sys.executable, "-c", VERSIONS], env=env, cwd=HERE, capture_output=True, text=True,
                       timeout=120)
    return json.loads(r.stdout) if r.returncode == 0 else {"versions_error": r.stderr.strip()[-300:]}
INSTALLS = ("auto", "installed", "pip", "path")


_PROBE_ERROR: list[str] = []


def _probe(env: dict) -> str | None:
    """Where a fresh interpreter imports memforest_gpu from (``None``: it cannot; the error
    is kept for the install record)."""
    r = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=HERE, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        _PROBE_ERROR.append(r.stderr.strip()[-300:])
        return None
    return r.stdout.strip()


def _ours(path: str | None) -> bool:
    return path is not None and os.path.realpath(path).startswith(os.path.realpath(ROOT) + os.sep)


def install(how: str, log) -> tuple[dict, dict]:
    """Make ``memforest_gpu`` importable from this checkout; returns (env for the steps, record figures)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    fig: dict = {"wheels": []}
    wheels = sorted(glob.glob(os.path.join(HERE, "wheels", "*.whl")))
    if wheels:
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                            "--find-links", os.path.join(HERE, "wheels"), *wheels],
                           capture_output=True, text=True, timeout=300)
        log.write(r.stdout + r.stderr)
        fig["wheels"] = [os.path.basename(w) for w in wheels]
        fig["wheels_rc"] = r.returncode
    if how in ("auto", "installed"):
        where = _probe(env)
        if _ours(where) or how == "installed":
            return env, {**fig, "method": "installed", "package": where}
    if how in ("auto", "pip"):
        r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                            "--no-build-isolation", "-e", ROOT], capture_output=True, text=True, timeout=300)
        log.write(r.stdout + r.stderr)
        where = _probe(env)
        if r.returncode == 0 and _ours(where):
            return env, {**fig, "method": "pip -e", "package": where}
        fig["pip_error"] = (r.stderr or r.stdout).strip()[-400:]
    env = dict(env, PYTHONPATH=os.pathsep.join([ROOT, env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    where = _probe(env)
    return env, {**fig, "method": "PYTHONPATH", "package": where, "importable": where is not None}


def run_step(name: str, limit: float, args, env: dict, records: str) -> None:
    """One step in its own process group, killed at ``limit`` seconds."""
    cmd = [sys.executable, os.path.join(HERE, "gpu_steps.py"), name, "--out", args.out]
    if args.rehearse:
        cmd.append("--rehearse")
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    t0 = time.perf_counter()
    with open(os.path.join(args.out, "logs", f"{name}.log"), "w") as log:
        p = subprocess.Popen(cmd, cwd=ROOT, env=dict(env, MEMFOREST_STEP_LIMIT=str(int(limit))), stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = p.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            append_record(records, step=name, name="step", status="timeout", rehearse=args.rehearse,
                          summary=f"killed at its {limit:.0f} s limit; its earlier records stand",
                          limit_s=limit, seconds=time.perf_counter() - t0)
            return
    sec = time.perf_counter() - t0
    if rc != 0:
        with open(os.path.join(args.out, "logs", f"{name}.log")) as f:
            tail = f.read()[-1500:]
        append_record(records, step=name, name="step", status="error", rehearse=args.rehearse,
                      summary=f"exit status {rc} after {sec:.0f} s (log: logs/{name}.log)", rc=rc, seconds=sec,
                      log_tail=tail)
    else:
        print(f"# step {name}: {sec:.1f} s", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rehearse", action="store_true", help="tiny sizes on the CPU (about a minute)")
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "runs", "gpu"),
                    help="records and logs go here (default $OUT, else runs/gpu)")
    ap.add_argument("--budget", type=float, default=None,
                    help="total seconds, setup included (default 470 on a GPU, 240 rehearsing)")
    ap.add_argument("--only", default=None, help=f"comma-separated steps out of {[s.name for s in STEPS]}")
    ap.add_argument("--install", default="auto", choices=INSTALLS,
                    help="auto: installed, else pip -e, else PYTHONPATH; or force one")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    budget = a.budget if a.budget is not None else (240.0 if a.rehearse else 470.0)
    names = [s.name for s in STEPS]
    only = names if a.only is None else [x.strip() for x in a.only.split(",") if x.strip()]
    bad = [x for x in only if x not in names]
    if bad:
        raise SystemExit(f"--only must name steps out of {names}, got {bad}")
    a.out = os.path.abspath(a.out)
    os.makedirs(a.out, exist_ok=True)
    records = os.path.join(a.out, RECORDS)
    start = len(read_records(records))  # a rerun appends; the summary shows this run only
    print(f"# memforest GPU verification{' (rehearsal, CPU)' if a.rehearse else ''}: budget {budget:.0f} s, "
          f"records -> {records}", flush=True)

    with open(os.path.join(a.out, "install.log"), "w") as log:
        env, fig = install(a.install, log)
    if a.rehearse:
        env = dict(env, CUDA_VISIBLE_DEVICES="")  # the rehearsal is the CPU path, GPU or not
    ok = fig.get("package") is not None
    ver = versions(env)
    append_record(records, step="setup", name="install", status="ok" if ok else "fail", rehearse=a.rehearse,
                  summary=f"{fig['method']}: {fig.get('package') or _PROBE_ERROR[-1:]}; torch {ver.get('torch')}, "
                          f"CUDA {ver.get('cuda')}, {ver.get('gpu') or 'no GPU'}",
                  device=ver.get("gpu") or "cpu", seconds=time.perf_counter() - t0,
                  python=sys.version.split()[0], versions=ver, **fig)
    if not ok:
        print(summary_table(read_records(records)[start:]))
        return 1
    for step in STEPS:
        if step.name not in only:
            continue
        left = budget - (time.perf_counter() - t0)
        limit = min(step.rehearse_s if a.rehearse else step.limit_s, left)
        if limit < 10:
            append_record(records, step=step.name, name="step", status="skipped", rehearse=a.rehearse,
                          summary=f"no time left in the {budget:.0f} s budget")
            continue
        run_step(step.name, limit, a, env, records)
    recs = read_records(records)[start:]
    print(f"\n# {len(recs)} records in {time.perf_counter() - t0:.0f} s -> {records}")
    print(summary_table(recs), flush=True)
    n_ok = sum(r.get("status") == "ok" for r in recs)
    n_skip = sum(r.get("status") == "skipped" for r in recs)
    print(f"records: {n_ok} passed, {len(recs) - n_ok - n_skip} failed, {n_skip} skipped", flush=True)
    return 0 if all(r.get("status") in ("ok", "skipped") for r in recs) else 1


if __name__ == "__main__":
    sys.exit(main())
