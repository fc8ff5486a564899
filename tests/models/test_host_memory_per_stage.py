"""Host memory follows the stage, not the model (issue 26): a 405 MB GPT on 4 ranks. Each
rank's peak RSS stays below the same rank's on a tiny model (the interpreter, torch and gloo)
plus 3 × its own stage's weights (weights and gradients with SGD, and the step's activations);
the launcher's, which builds and validates the model from shapes only, below the tiny run's
plus 50 MB. Before each rank built only its stage, every rank and the launcher held the whole
405 MB model at least once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MiB = 2**20


@pytest.mark.distributed
@pytest.mark.timeout(600)
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_peak_host_memory_follows_the_stage() -> None:
    script = Path(__file__).with_name("host_memory_job.py")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=540)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    tiny, big = found["tiny"], found["big"]
    assert sum(big["stage_bytes"]) > 400e6  # the model is big ...
    assert max(big["stage_bytes"]) < 0.3 * sum(big["stage_bytes"])  # ... and split in four
    for rank, (peak, overhead, stage) in enumerate(zip(big["ranks"], tiny["ranks"],
                                                       big["stage_bytes"])):
        assert peak < overhead + 3 * stage, (
            f"rank {rank}: peak RSS {peak / MiB:.0f} MiB, tiny model's {overhead / MiB:.0f} "
            f"MiB, its stage {stage / MiB:.0f} MiB")
    assert big["launcher"] < tiny["launcher"] + 50 * MiB, (big["launcher"], tiny["launcher"])
