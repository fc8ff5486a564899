#!/usr/bin/env bash
# On a machine with one GPU. Uses the python3 that holds a CUDA build of torch; installs nothing.
# Writes to $OUT (default benchmarks/results/).
#
#   scripts/gpu_check.sh          (~7 min) the `cuda` tests alone, a probe of gloo's collectives
#                                 on CUDA tensors, then the GPU benchmarks on a quiet host
#                                 (benchmarks/gpu_check.py), then what a rank process costs over
#                                 in-process (benchmarks/rank_cost.py, the 551 M Llama):
#                                 gpu_check.json, gpu_check_tests.log, rank_cost_gpu.json
#   scripts/gpu_check.sh suite    (up to 9 min) the rest of the suite on the machine's torch,
#                                 pytest-xdist, one worker per 2 cores: gpu_suite.log
#
# Keep the two apart: on 2026-11-27 the suite beside the `cuda` tests overran both limits and
# its killed processes slowed the benchmarks after it (docs/gpu.md).
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
if [[ ${1:-} == suite ]]; then
    # Each worker pinned to 2 cores of its own (tests/worker_cores.py): the suite's ranks size
    # their threads from the cores they see. -v names every failure the moment it happens, so
    # a run cut off by the limit still says which tests failed (2026-11-27: 11 unnamed).
    workers=$(( $(nproc) / 2 > 1 ? $(nproc) / 2 - 1 : 1 ))
    PIPEWEAVE_TEST_CORES=2 timeout 530 python3 -m pytest -m "not cuda" tests -n "$workers" \
        -p no:cacheprovider --timeout 300 -v -rfE --tb=short > "$out/gpu_suite.log" 2>&1
    echo "suite: exit $? after $(( $(date +%s) - started )) s, $workers workers of 2 cores"
    grep -E "(FAILED|ERROR) tests/" "$out/gpu_suite.log" | head -40
    tail -2 "$out/gpu_suite.log"
    exit 0
fi
timeout 130 python3 -m pytest -m cuda tests/cuda -q -rfE -p no:cacheprovider --timeout 120 \
    --durations=8 2>&1 | tee "$out/gpu_check_tests.log" | tail -30
echo "cuda tests: exit ${PIPESTATUS[0]} after $(( $(date +%s) - started )) s"
timeout 30 python3 benchmarks/gpu/gloo_cuda_probe.py 2>&1 | grep -v Warning | tail -6
timeout 250 python3 benchmarks/gpu_check.py --out "$out/gpu_check.json" --deadline-s 230 \
    --parts plain pipeweave plain-again stages schedules cli
echo "gpu_check.py: exit $? after $(( $(date +%s) - started )) s in all"
timeout 150 python3 benchmarks/rank_cost.py --device cuda --steps 12 --warm 3 --repeats 2 \
    --hf-config benchmarks/gpu/llama550m.json --batch-size 16 --seq-len 1024 \
    --precision bf16-mixed --optimizer adamw --lr 3e-4 \
    --json-out "$out/rank_cost_gpu.json" 2>&1 | grep -v Warning | tail -8
echo "rank_cost.py: exit ${PIPESTATUS[0]} after $(( $(date +%s) - started )) s in all"
