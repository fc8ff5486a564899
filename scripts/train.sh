#!/usr/bin/env bash
# Set everything up, then run the default training job (extra arguments go to `pipeweave train`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/pipeweave train "$@"
