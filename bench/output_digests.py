"""SHA-256 of the stores ``memforest compress`` writes, over several configurations: run it
with one revision's code and then another's, and compare the lines (a change that must not
alter any output keeps every digest). Each line has the file's digest and its content's (the
table read back): a change to how a file is encoded, not what it holds, keeps the second.

    PYTHONPATH=. python bench/output_digests.py --workdir /tmp/digests > head.txt
    PYTHONPATH=../base python bench/output_digests.py --workdir /tmp/digests > base.txt
    diff base.txt head.txt

The synthetic input stores are written once under ``--workdir`` (same seeds, same bytes on
every revision whose synthetic writer is unchanged: their digests are printed too).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys

# (name, input store, extra flags): presets, schedules, k-means kinds, keys, int8 vectors, JSON Lines
CONFIGS = [
    ("memforest-matching-2lvl", "few", ["--kmeans", "two-level", "--schedule", "matching"]),
    ("paper-matching-2lvl", "few", ["--preset", "paper", "--kmeans", "two-level", "--schedule", "matching"]),
    ("paper-sequential-exact", "few", ["--preset", "paper", "--schedule", "sequential"]),
    ("memforest-sequential", "few", ["--schedule", "sequential"]),
    ("memforest-keys0", "few", ["--keys", "0"]),
    ("memforest-int8", "few", ["--vectors", "int8"]),
    ("memforest-ratio03-jsonl", "few", ["--ratio", "0.3"], ),
    ("memforest-many", "many", []),
    ("paper-many", "many", ["--preset", "paper"]),
]


def sha(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()[:16]


def content_sha(path: str) -> str:
    """SHA-256 of what a Parquet file holds (schema with its metadata, every column's values),
    whatever its pages and encodings: the table read back as one Arrow IPC batch. A JSON Lines
    file's content is its bytes."""
    if not path.endswith(".parquet"):
        return sha(path)
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pq.read_table(path).combine_chunks()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    return hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()[:16]


def inputs(workdir: str, n: int) -> dict[str, str]:
    """The input stores: 8 tenants (one of half the nodes) and 300 heavy-tailed ones."""
    from memforest_gpu.store.synthetic import few_tenant_sizes, heavy_tailed_sizes, write_synthetic_parquet

    os.makedirs(workdir, exist_ok=True)
    out = {}
    for name, sizes in (("few", few_tenant_sizes(n, 8, 0.5)), ("many", heavy_tailed_sizes(n, 300, seed=n))):
        path = os.path.join(workdir, f"in-{name}-{n}.parquet")
        if not os.path.exists(path):
            write_synthetic_parquet(path, sizes, dim=64, seed=n)
        out[name] = path
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default="/tmp/memforest-digests")
    ap.add_argument("--n", type=int, default=48000, help="nodes per input store (its big tenant: half)")
    ap.add_argument("--only", default=None, help="comma-separated config names")
    a = ap.parse_args(argv)
    src = inputs(a.workdir, a.n)
    for name, path in src.items():
        print(f"input {name} {sha(path)}", flush=True)
    only = set(a.only.split(",")) if a.only else None
    for name, store, flags in CONFIGS:
        if only and name not in only:
            continue
        ext = "jsonl" if name.endswith("jsonl") else "parquet"
        out = os.path.join(a.workdir, f"out-{name}-{os.getpid()}.{ext}")
        cmd = [sys.executable, "-m", "memforest_gpu.cli", "compress", src[store], out, "--embedder", "none",
               "--quiet", *flags]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{name} FAILED rc={r.returncode}: {r.stderr[-500:]}", flush=True)
            continue
        print(f"{name} {sha(out)} content {content_sha(out)}", flush=True)
        os.unlink(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
