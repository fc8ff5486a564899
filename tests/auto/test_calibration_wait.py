"""The share of a core a waiting rank takes (``RuntimeCosts.wait_share``), fitted by the
calibration where more ranks than cores share the machine (measure/calibration_rounds.py
``borrow``), on synthetic runs at a planted share: 4 ranks on 2 cores, the default plan (a
pipeline: most ranks wait) and the data-parallel plan (every rank computes) at one compute
speed per round. No process runs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pytest

from auto_fixtures import replayed, small_profile
from pipeweave.auto import AutoProblem
from pipeweave.measure.calibration_rounds import WAIT_SHARE, fit_rounds, scale_name
from pipeweave.measure.calibration_runs import (PARAMETERS, CalibrationPlan, calibration_plans,
                                                fit_calibration)
from pipeweave.profiler import LinkProfile
from pipeweave.profiler.runtime_costs import RuntimeCosts

TRUTH = {"message_latency": 2e-3, "allreduce_latency": 1e-2, WAIT_SHARE: 0.4}
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


def test_waiting_ranks_slow_the_pipeline_s_compute_and_not_where_each_has_a_core() -> None:
    """The premise of the fit: the share moves the default plan's simulated compute where
    4 ranks share 2 cores, and nothing where they share 4."""
    shared = calibration_plans(_problem(2), actions=False)["default"]
    assert shared.compute({WAIT_SHARE: 0.4}) > 1.05 * shared.compute({WAIT_SHARE: 0.0})
    own = calibration_plans(_problem(4), actions=False)["default"]
    for probe in (own.compute, own.iteration):
        assert probe({WAIT_SHARE: 0.4}) == probe({WAIT_SHARE: 0.0})


def test_a_planted_share_is_recovered_with_the_latencies() -> None:
    plans = calibration_plans(_problem(), actions=False)
    assert set(plans) == {"default", "data-parallel"}
    times, compute = _runs(plans, TRUTH)
    found = fit_rounds(plans, PARAMETERS, times, compute, BORROW)
    for name, value in TRUTH.items():
        assert found.fitted[name] == pytest.approx(value, rel=1e-3), name
    for one, speed in zip(found.rounds, SPEEDS):
        assert one[scale_name("data-parallel")] == pytest.approx(speed, rel=1e-4)
        assert scale_name("default") not in one  # it runs at the data-parallel plan's scale
    assert found.fitted["compute_scale"] == pytest.approx(SPEEDS[2], rel=1e-4)  # the median
    # Without the share, the default's own scale absorbs its waiting ranks: too high.
    alone = fit_rounds(plans, PARAMETERS, times, compute)
    assert WAIT_SHARE not in alone.fitted
    assert alone.rounds[0][scale_name("default")] > 1.05 * SPEEDS[0]


def test_fit_calibration_fits_the_share_only_where_ranks_outnumber_cores() -> None:
    for cores, expected in ((2, TRUTH[WAIT_SHARE]), (4, 0.0), (None, 0.0)):
        problem = _problem(cores)
        plans = calibration_plans(problem, actions=False)
        times, compute = _runs(plans, TRUTH)
        fitted, fit = fit_calibration(problem, time_one=replayed(times, compute, 4), rounds=3,
                                      seconds=0.1, actions=False)
        assert fit is not None
        runtime = fitted.profile.runtime
        assert runtime is not None
        assert runtime.wait_share == pytest.approx(expected, rel=1e-3), cores
        assert fit.to_json().get(WAIT_SHARE, 0.0) == pytest.approx(expected, rel=1e-3)


def test_the_share_is_saved_and_validated() -> None:
    costs = RuntimeCosts(wait_share=0.25)
    assert RuntimeCosts.from_json(costs.to_json()).wait_share == 0.25
    assert RuntimeCosts.from_json({}).wait_share == 0.0
    for bad in (-0.1, float("nan"), True, "0.3"):
        with pytest.raises(ValueError, match="wait_share"):
            RuntimeCosts(wait_share=bad)  # type: ignore[arg-type]
