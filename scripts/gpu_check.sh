#!/usr/bin/env bash
# On a machine with one GPU (at most ~6 minutes): the `cuda` tests, then the GPU benchmarks
# (runtime overhead over a plain loop, host syncs per step, every schedule on one GPU, the CLI).
# Uses the python3 that holds a CUDA build of torch; nothing is installed. Writes
# $OUT/gpu_check.json (default benchmarks/results/), the test log and the profiler table.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-benchmarks/results}
mkdir -p "$out"
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
python3 - <<'PY'
import torch, transformers
print("torch", torch.__version__, "transformers", transformers.__version__,
      "gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
PY
nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm --format=csv,noheader || true
started=$(date +%s)
timeout 170 python3 -m pytest -m cuda tests/cuda -q -rfE -p no:cacheprovider --timeout 150 \
    --durations=8 2>&1 | tee "$out/gpu_check_tests.log" | tail -40
echo "cuda tests: exit ${PIPESTATUS[0]} after $(( $(date +%s) - started )) s"
timeout 230 python3 benchmarks/gpu_check.py --out "$out/gpu_check.json" --deadline-s 150
echo "gpu_check.py: exit $? after $(( $(date +%s) - started )) s in all"
