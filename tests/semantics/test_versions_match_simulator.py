"""Peak weight versions measured in the runtime equal the simulator's counts."""

from __future__ import annotations

import pytest

from pipeweave.runtime import run_local
from pipeweave.runtime.worker import make_schedule
from pipeweave.sim import simulate

from test_async_oracle import make_job

EXPECTED = {  # closed forms for P stages, stage s
    "pipedream": lambda p, s: p - s,
    "2bw": lambda p, s: 2,
    "pipeoptim": lambda p, s: 2 if s < p - 1 else 1,
    "wpipe": lambda p, s: 2 if s < p else 1,
}


@pytest.mark.parametrize("method", ["pipedream", "pipedream-vs", "2bw", "pipeoptim", "spectrain", "wpipe"])
@pytest.mark.parametrize("depth", [2, 3, 4])
def test_runtime_versions_equal_simulator(method: str, depth: int) -> None:
    job = make_job(method, depth, "sgd", steps=4)
    measured: dict[int, int] = {}
    for result in run_local(job):
        measured.update(result.peak_weight_versions)
    simulated = simulate(make_schedule(job.plan, job.steps)).weight_versions
    assert [measured[s] for s in sorted(measured)] == simulated
    if method in EXPECTED:
        assert simulated == [EXPECTED[method](depth, s) for s in range(len(simulated))]
