#!/usr/bin/env bash
# On a machine with one GPU (about nine minutes; the lent machines have ~16 cores):
#   1. the whole suite but the `cuda` tests, on the machine's own torch (pytest-xdist over the
#      cores), beside the `cuda` tests and a probe of gloo's CUDA collectives;
#   2. then, on a quiet host, the GPU benchmarks (benchmarks/gpu_check.py: overhead over a plain
#      loop, the large model at P stages on one GPU, every schedule on one GPU, the CLI).
# Uses the python3 that holds a CUDA build of torch; nothing is installed. Writes
# $OUT (default benchmarks/results/): gpu_check.json, gpu_check_tests.log, gpu_suite.log.
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
workers=$(( $(nproc) > 8 ? $(nproc) - 4 : 2 ))
( timeout 220 python3 -m pytest -m "not cuda" tests -n "$workers" -p no:cacheprovider \
      --timeout 200 -v --tb=short > "$out/gpu_suite.log" 2>&1
  echo "suite: exit $? after $(( $(date +%s) - started )) s" >> "$out/gpu_suite.log" ) &
suite=$!
timeout 200 python3 -m pytest -m cuda tests/cuda -q -rfE -p no:cacheprovider --timeout 180 \
    --durations=8 2>&1 | tee "$out/gpu_check_tests.log" | tail -30
echo "cuda tests: exit ${PIPESTATUS[0]} after $(( $(date +%s) - started )) s"
timeout 40 python3 benchmarks/gpu/gloo_cuda_probe.py 2>&1 | grep -v Warning | tail -6
wait "$suite"
echo "== whole suite (not cuda), $workers workers:"
grep -E "^(FAILED|ERROR)|(FAILED|ERROR) tests/" "$out/gpu_suite.log" | sort -u | head -40
tail -3 "$out/gpu_suite.log"
timeout 330 python3 benchmarks/gpu_check.py --out "$out/gpu_check.json" --deadline-s 290 \
    --parts plain pipeweave plain-again stages cli cli-local schedules
echo "gpu_check.py: exit $? after $(( $(date +%s) - started )) s in all"
