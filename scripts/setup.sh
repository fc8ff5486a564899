#!/usr/bin/env bash
# Create .venv and install pipeweave with its test tools. Idempotent.
# CPU machines: torch==2.13.0 is installed first (the CPU wheel), so the package's loose
# `torch>=2.11` requirement is already satisfied and no multi-GB CUDA build is pulled.
# The hf extra (transformers, for pipeweave.hf and its tests) does not depend on torch.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/pip install --quiet "torch==${PIPEWEAVE_TORCH_VERSION:-2.13.0}"
fi
.venv/bin/pip install --quiet -e ".[dev,hf]"
