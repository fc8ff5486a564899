#!/usr/bin/env bash
# Set everything up, then run the type check and the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m mypy
exec .venv/bin/python -m pytest -q "$@"
