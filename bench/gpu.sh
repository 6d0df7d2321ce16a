#!/usr/bin/env bash
# One command for a lent GPU: every benchmark at GPU sizes, JSON under ${OUT:-runs/gpu}.
# Budget: about 8 minutes on one H200. Needs torch with CUDA (and triton for the fused kernels).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python - <<'PY'
import torch; assert torch.cuda.is_available(), "bench/gpu.sh needs CUDA"
print("# device:", torch.cuda.get_device_name(0))
PY
# kernel agreement on the real GPU first (Triton vs PyTorch, MST vs networkx, ...)
python -m pytest -q tests/test_kernels_*.py tests/test_triton_kernels.py 2>&1 | tail -3
# k-means throughput: fused assignment at 1M x 50k x 384 (TF32 dense rate is the yardstick)
python bench/kmeans_throughput.py --n 1000000 --dim 384 --out "$OUT/kmeans.json"
# partition + trees + merge planning at 1M nodes, d=384 and d=1536 (mean embeddings, no text merger)
python bench/scaling.py --sizes 100000,1000000 --dim 384 --kmeans two-level --schedule matching \
    --device cuda --out "$OUT/scaling_384.json"
python bench/scaling.py --sizes 1000000 --dim 1536 --kmeans two-level --schedule matching \
    --device cuda --out "$OUT/scaling_1536.json"
python bench/versus_reference.py --sizes 2000,10000 --out "$OUT/versus.json"
python bench/retrieval.py --sizes 100000,1000000 --queries 4096 --device cuda --out "$OUT/retrieval.json"
