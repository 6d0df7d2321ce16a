#!/usr/bin/env bash
# One command for a lent GPU: every GPU figure in <= 8 minutes, one JSON record per result
# appended to $OUT/gpu_records.jsonl as soon as it exists (default OUT: runs/gpu).
#   bash bench/gpu.sh              # on the GPU
#   bash bench/gpu.sh --rehearse   # tiny sizes on the CPU, same steps and records (CI)
# Installs the project offline first (see bench/gpu.py); docs/gpu.md says what each step measures.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$(command -v python3 || command -v python)}
exec "$PY" bench/gpu.py "$@"
