"""Compare two git revisions on one benchmark: interleaved runs, per-stage ratios with spread.

    python bench/compare.py REV_A REV_B [--reps 5] -- python bench/scaling.py --sizes 200000 --json-lines

Each revision is checked out once into its own worktree (under ``--workdir``, reused on the
next call). The benchmark command runs from THIS checkout (its scripts) with ``PYTHONPATH``
set to a revision's worktree, so both revisions run the same script against their own
package. Runs alternate A B B A A B ... (each pair in both orders, so a drift of the
machine hits both alike), ``--reps`` times each.

A run's figures are the JSON objects it prints, one per line (``bench/scaling.py
--json-lines``): every number under ``seconds`` or ``stages``, and every top-level number
whose key ends in ``_s``, ``seconds`` or ``_mb``, is a metric. For each metric the table
gives both medians and the ratio B / A: the median of the per-pair ratios, with their min
and max (a ratio below 1 means B is faster or smaller). A metric one revision lacks is
listed with that side empty (stage names change between versions).

Time both revisions on a quiet machine: another job on two cores changes a run by 2-4x.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def worktree(rev: str, workdir: str) -> tuple[str, str]:
    """(full sha, path) of a worktree of ``rev``, made once."""
    sha = subprocess.run(["git", "-C", ROOT, "rev-parse", "--verify", f"{rev}^{{commit}}"], capture_output=True,
                         text=True)
    if sha.returncode != 0:
        raise SystemExit(f"compare.py: {rev!r} is not a revision of this repository: {sha.stderr.strip()}")
    sha = sha.stdout.strip()
    path = os.path.join(workdir, sha[:12])
    if not os.path.exists(os.path.join(path, "memforest_gpu")):
        os.makedirs(workdir, exist_ok=True)
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "--force", path, sha], check=True,
                       capture_output=True)
    return sha, path


def metrics(output: str) -> dict[str, float]:
    """The numbers of every JSON line of ``output`` (module docstring), prefixed by the line's
    ``n`` / ``preset`` / ``name`` when it has one, so several records stay apart."""
    out: dict[str, float] = {}
    for line in output.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        tag = "/".join(str(rec[k]) for k in ("name", "preset", "n") if k in rec)
        pre = f"{tag}:" if tag else ""
        for k, v in rec.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k.endswith(("_s", "seconds", "_mb")):
                out[pre + k] = float(v)
            elif isinstance(v, dict) and k in ("seconds", "stages"):
                for kk, vv in v.items():
                    if isinstance(vv, (int, float)) and not isinstance(vv, bool):
                        out[f"{pre}{k}.{kk}"] = float(vv)
                    elif isinstance(vv, dict) and isinstance(vv.get("seconds"), (int, float)):
                        out[f"{pre}{k}.{kk}"] = float(vv["seconds"])
                        if isinstance(vv.get("rss_peak_mb"), (int, float)):  # bench/stage_memory.py's stages
                            out[f"{pre}{k}.{kk}.peak_mb"] = float(vv["rss_peak_mb"])
    return out


def run(cmd: list[str], path: str) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=path + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"compare.py: the benchmark failed on {path} (exit {p.returncode}):\n"
                         f"{(p.stdout + p.stderr)[-3000:]}")
    got = metrics(p.stdout)
    if not got:
        raise SystemExit(f"compare.py: the benchmark printed no JSON line with figures on {path}; "
                         f"its output ends with:\n{p.stdout[-1500:]}")
    return got


def table(a: list[dict], b: list[dict], name_a: str, name_b: str) -> str:
    keys = sorted(set().union(*a, *b))
    rows = [f"{'metric':<44} {name_a:>10} {name_b:>10} {'B/A':>7} {'min':>7} {'max':>7}"]
    for k in keys:
        va = [r[k] for r in a if k in r]
        vb = [r[k] for r in b if k in r]
        ma = f"{statistics.median(va):10.3f}" if va else f"{'-':>10}"
        mb = f"{statistics.median(vb):10.3f}" if vb else f"{'-':>10}"
        pairs = [rb[k] / ra[k] for ra, rb in zip(a, b) if k in ra and k in rb and ra[k] > 0]
        if pairs:
            rows.append(f"{k:<44} {ma} {mb} {statistics.median(pairs):7.3f} {min(pairs):7.3f} {max(pairs):7.3f}")
        else:
            rows.append(f"{k:<44} {ma} {mb} {'':>7} {'':>7} {'':>7}")
    return "\n".join(rows)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 usage="compare.py REV_A REV_B [--reps N] [--workdir DIR] [--json FILE] -- "
                                       "BENCHMARK COMMAND ...")
    ap.add_argument("rev_a")
    ap.add_argument("rev_b")
    ap.add_argument("--reps", type=int, default=3, help="runs of each revision (default 3)")
    ap.add_argument("--workdir", default="/tmp/memforest-compare", help="where the worktrees go")
    ap.add_argument("--json", default=None, help="also write every run's figures here")
    if "--" not in argv:
        if {"-h", "--help"} & set(argv):
            ap.print_help()
            return 0
        raise SystemExit("usage: compare.py REV_A REV_B [--reps N] [--workdir DIR] -- BENCHMARK COMMAND ...")
    cut = argv.index("--")
    a = ap.parse_args(argv[:cut])
    cmd = argv[cut + 1:]
    if not cmd:
        raise SystemExit("compare.py: give the benchmark command after --")
    if a.reps < 1:
        raise SystemExit(f"compare.py: --reps must be an integer >= 1, got {a.reps}")
    (sha_a, path_a), (sha_b, path_b) = worktree(a.rev_a, a.workdir), worktree(a.rev_b, a.workdir)
    print(f"# A = {a.rev_a} ({sha_a[:12]}), B = {a.rev_b} ({sha_b[:12]}), {a.reps} runs each, interleaved; "
          f"command: {' '.join(cmd)}", flush=True)
    runs_a, runs_b = [], []
    for i in range(a.reps):
        order = ((path_a, runs_a, "A"), (path_b, runs_b, "B"))
        for path, into, name in (order if i % 2 == 0 else order[::-1]):
            into.append(run(cmd, path))
            total = next((v for k, v in into[-1].items() if k.endswith("seconds")), None)
            print(f"# run {i + 1} {name}: " + (f"{total:.2f} s" if total is not None else "done"), flush=True)
    print(table(runs_a, runs_b, "A", "B"))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"a": {"rev": a.rev_a, "sha": sha_a, "runs": runs_a},
                       "b": {"rev": a.rev_b, "sha": sha_b, "runs": runs_b}, "command": cmd}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
