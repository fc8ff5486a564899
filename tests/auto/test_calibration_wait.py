"""What waiting costs the ranks of a pipeline where more ranks than cores share the machine,
fitted by the calibration from the default plan's compute at the data-parallel plan's scale
(measure/calibration_rounds.py ``borrow``): ``compute_per_receive`` (seconds each action that
takes a message from another rank computes beyond the others, the default) or
``wait_share`` (a waiting rank's share of a core, sim/shared_cores.py). On synthetic runs at
a planted value: 4 ranks on 2 cores, the default plan (a pipeline: most ranks wait) and the
data-parallel plan (every rank computes) at one compute speed per round. No process runs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pytest

from auto_fixtures import replayed, small_profile
from pipeweave.auto import AutoProblem
from pipeweave.measure.calibration_rounds import (PER_RECEIVE, WAIT_SHARE, fit_rounds,
                                                  scale_name)
from pipeweave.measure.calibration_runs import (PARAMETERS, CalibrationPlan, calibration_plans,
                                                fit_calibration, with_costs)
from pipeweave.planner.evaluate import Network, plan_costs
from pipeweave.profiler import LinkProfile
from pipeweave.profiler.runtime_costs import RuntimeCosts

LATENCIES = {"message_latency": 2e-3, "allreduce_latency": 1e-2}
PLANTED = {PER_RECEIVE: 4e-3, WAIT_SHARE: 0.4}
SPEEDS = (1.10, 1.35, 1.20)
"""The machine's compute speed in each of three rounds, the same for both plans."""
BORROW = {"default": "data-parallel"}


def _problem(cores: int | None = 2) -> AutoProblem:
    profile = replace(small_profile(5, blocks=8, link=LinkProfile(1e9, 1e-5)),
                      runtime=RuntimeCosts(per_message=2e-5, allreduce_bandwidth=3e8))
    return AutoProblem(profile=profile, ranks=4, shared_cores=cores)


def _runs(plans: Mapping[str, CalibrationPlan], truth: Mapping[str, float]
          ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per plan, each round's iteration and compute seconds at ``truth`` and the round's
    speed."""
    at = [{**truth, "compute_scale": speed} for speed in SPEEDS]
    return ({label: [plan.iteration(v) for v in at] for label, plan in plans.items()},
            {label: [plan.compute(v) for v in at] for label, plan in plans.items()})


def test_a_receiving_action_pays_the_cost_and_no_other() -> None:
    """F pays it where the previous stage is on another rank, B and I where the next is; the
    first stage's F, the last's B, every W and update, and a data-parallel stage do not."""
    profile = small_profile(3, blocks=6)
    bounds = ((0, 2), (2, 4), (4, 6))
    base = replace(profile, runtime=RuntimeCosts())
    plain = plan_costs(base, bounds, Network(1e9))
    paid = plan_costs(with_costs(base, {PER_RECEIVE: 3e-3}), bounds, Network(1e9))
    assert isinstance(paid.forward, tuple) and isinstance(plain.forward, tuple)
    assert [a - b for a, b in zip(paid.forward, plain.forward)] == pytest.approx([0, 3e-3, 3e-3])
    for name in ("backward", "input_grad"):
        more = [a - b for a, b in zip(getattr(paid, name), getattr(plain, name))]
        assert more == pytest.approx([3e-3, 3e-3, 0]), name
    assert paid.weight_grad == plain.weight_grad and paid.update == plain.update
    whole = ((0, 6),)
    assert plan_costs(with_costs(base, {PER_RECEIVE: 3e-3}), whole, Network(1e9),
                      replicas=(4,)) == plan_costs(base, whole, Network(1e9), replicas=(4,))


def test_waiting_ranks_slow_the_pipeline_s_compute_and_not_where_each_has_a_core() -> None:
    """The premise of a fitted share: it moves the default plan's simulated compute where 4
    ranks share 2 cores, and nothing where they share 4."""
    shared = calibration_plans(_problem(2), actions=False)["default"]
    assert shared.compute({WAIT_SHARE: 0.4}) > 1.05 * shared.compute({WAIT_SHARE: 0.0})
    own = calibration_plans(_problem(4), actions=False)["default"]
    for probe in (own.compute, own.iteration):
        assert probe({WAIT_SHARE: 0.4}) == probe({WAIT_SHARE: 0.0})


@pytest.mark.parametrize("fixes", [PER_RECEIVE, WAIT_SHARE])
def test_a_planted_value_is_recovered_with_the_latencies(fixes: str) -> None:
    plans = calibration_plans(_problem(), actions=False)
    assert set(plans) == {"default", "data-parallel"}
    truth = {**LATENCIES, fixes: PLANTED[fixes]}
    times, compute = _runs(plans, truth)
    found = fit_rounds(plans, PARAMETERS, times, compute, BORROW, fixes)
    for name, value in truth.items():
        assert found.fitted[name] == pytest.approx(value, rel=1e-3), name
    for one, speed in zip(found.rounds, SPEEDS):
        assert one[scale_name("data-parallel")] == pytest.approx(speed, rel=1e-4)
        assert scale_name("default") not in one  # it runs at the data-parallel plan's scale
    assert found.fitted["compute_scale"] == pytest.approx(SPEEDS[2], rel=1e-4)  # the median
    with pytest.raises(ValueError, match="fixes='compute_scale'"):
        fit_rounds(plans, PARAMETERS, times, compute, BORROW, "compute_scale")
    # Without it, the default's own scale absorbs what its waits cost: too high.
    alone = fit_rounds(plans, PARAMETERS, times, compute)
    assert fixes not in alone.fitted
    assert alone.rounds[0][scale_name("default")] > 1.05 * SPEEDS[0]


def test_fit_calibration_fits_the_receive_cost_whatever_the_cores() -> None:
    """The default plan computes at the data-parallel plan's scale and its extra compute is
    the cost per received message with a core per rank too (at 2 ranks on 2 cores the
    default computed at 1.01-1.28x the profile where the data-parallel plan took
    0.92-1.16x in the same rounds, calibration_runs._borrowed)."""
    truth = {**LATENCIES, PER_RECEIVE: PLANTED[PER_RECEIVE]}
    for cores, expected in ((2, PLANTED[PER_RECEIVE]), (4, PLANTED[PER_RECEIVE]),
                            (None, PLANTED[PER_RECEIVE])):
        problem = _problem(cores)
        plans = calibration_plans(problem, actions=False)
        times, compute = _runs(plans, truth)
        fitted, fit = fit_calibration(problem, time_one=replayed(times, compute, 4), rounds=3,
                                      seconds=0.1, actions=False)
        assert fit is not None
        runtime = fitted.profile.runtime
        assert runtime is not None and runtime.wait_share == 0.0
        assert runtime.compute_per_receive == pytest.approx(expected, rel=1e-3), cores
        assert fit.to_json().get(PER_RECEIVE, 0.0) == pytest.approx(expected, rel=1e-3)


def test_both_are_saved_and_validated() -> None:
    costs = RuntimeCosts(wait_share=0.25, compute_per_receive=1e-3)
    again = RuntimeCosts.from_json(costs.to_json())
    assert (again.wait_share, again.compute_per_receive) == (0.25, 1e-3)
    assert RuntimeCosts.from_json({}).wait_share == RuntimeCosts().compute_per_receive == 0.0
    for name in ("wait_share", "compute_per_receive"):
        for bad in (-0.1, float("nan"), True, "0.3"):
            with pytest.raises(ValueError, match=name):
                RuntimeCosts(**{name: bad})
