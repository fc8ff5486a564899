"""Run a benchmark script the way its docstring says: a fresh interpreter, src on PYTHONPATH.

A fresh interpreter matters: the benchmarks start forkserver processes that must import
``pipeweave`` (and, for the torch side, modules next to the script) on their own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_benchmark(script: str, *args: str, timeout: float = 280) -> subprocess.CompletedProcess[str]:
    """Run ``benchmarks/<script>`` with ``args``; fail with its stderr's tail if it fails."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    completed = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args],
                               capture_output=True, text=True, timeout=timeout, env=env)
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed
