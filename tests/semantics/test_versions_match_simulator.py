"""Peak weight versions measured in the runtime equal the simulator's counts."""

from __future__ import annotations

import pytest

from pipeweave.runtime import run_local
from pipeweave.runtime.execution.parts import make_schedule
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


@pytest.mark.parametrize("depth", [2, 3, 4])
def test_graph_backward_keeps_one_prediction_per_microbatch_in_flight(depth: int) -> None:
    """PipeOptim with ``backward="graph"`` keeps each predicted copy until its backward:
    stage s holds the live set plus one per micro-batch in flight (P - s of them) on every
    stage that predicts, and the simulator counts the same when told so."""
    job = make_job("pipeoptim", depth, "sgd", steps=4, semantics={"backward": "graph"})
    measured: dict[int, int] = {}
    for result in run_local(job):
        measured.update(result.peak_weight_versions)
    schedule = make_schedule(job.plan, job.steps)
    simulated = simulate(schedule, keep_predicted=True).weight_versions
    assert [measured[s] for s in sorted(measured)] == simulated
    assert simulated == [depth - s + 1 if s < depth - 1 else 1 for s in range(depth)]
    assert simulate(schedule).weight_versions == [EXPECTED["pipeoptim"](depth, s)
                                                  for s in range(depth)]
