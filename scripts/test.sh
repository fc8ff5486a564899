#!/usr/bin/env bash
# Set everything up, then run the type check and the test suite.
# The type check runs beside the tests at the lowest CPU priority (nice 19): it takes only the
# cycles the tests leave idle (most tests use one core of several), so it adds little to the
# wall time and does not slow the tests that time themselves. Its report is printed after the
# tests; the script fails if either fails (the tests' status first).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
mypy_log=$(mktemp)
nice -n 19 .venv/bin/python -m mypy >"$mypy_log" 2>&1 &
mypy_pid=$!
tests=0
.venv/bin/python -m pytest -q "$@" || tests=$?
types=0
wait "$mypy_pid" || types=$?
echo "mypy:"
cat "$mypy_log"
rm -f "$mypy_log"
if [ "$tests" -ne 0 ]; then exit "$tests"; fi
exit "$types"
