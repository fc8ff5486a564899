"""The compute each action of a distributed run costs beyond its profiled blocks
(measure/calibration_sizes.py), fitted from the data-parallel plans at two micro-batch sizes,
on synthetic runs that 'measure' what the model predicts at known parameters. No process
runs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

import pytest

from auto_fixtures import small_profile
from pipeweave.auto import AutoProblem
from pipeweave.auto.predict import simulate_candidate
from pipeweave.auto.scaling import scaled_profile
from pipeweave.measure.calibration_runs import (CalibrationPlan, calibration_plans,
                                                data_parallel_candidate, fit_calibration,
                                                with_costs)
from pipeweave.measure.calibration_sizes import (PER_ACTION, action_compute,
                                                 fit_action_compute, round_action_compute)
from pipeweave.planner.evaluate import Network, plan_costs
from pipeweave.planner.plan import Plan
from pipeweave.profiler import LinkProfile
from pipeweave.profiler.runtime_costs import RuntimeCosts


def _problem(ranks: int = 2) -> AutoProblem:
    profile = replace(small_profile(5, blocks=8, link=LinkProfile(1e9, 1e-5)),
                      runtime=RuntimeCosts(per_action={"forward": 1e-4, "update": 2e-4},
                                           per_message=2e-5, allreduce_bandwidth=3e8))
    return AutoProblem(profile=profile, ranks=ranks)


def test_one_round_gives_the_cost_in_closed_form() -> None:
    """C = s (S + n k) for both plans at one load s: k comes back; compute that grew in
    proportion to the profile says 0; more compute for the larger micro-batches, 0 too."""
    large, small, k, s = (0.40, 16.0), (0.35, 64.0), 2e-3, 1.7
    measured = [s * (total + count * k) for total, count in (large, small)]
    assert round_action_compute(large, small, *measured) == pytest.approx(k, rel=1e-12)
    assert round_action_compute(large, small, s * 0.40, s * 0.35) == 0.0
    assert round_action_compute(large, small, 1.0, 9.0) == 0.0


def test_the_median_over_rounds_leaves_out_a_disturbed_round() -> None:
    def probe(total: float, count: float) -> Callable[[Mapping[str, float]], float]:
        return lambda values: total + count * values.get(PER_ACTION, 0.0)

    large, small = probe(0.40, 16.0), probe(0.35, 64.0)
    k = 1e-3
    loads = (1.2, 1.6, 1.3)
    measured_large = [s * (0.40 + 16 * k) for s in loads]
    measured_small = [s * (0.35 + 64 * k) for s in loads]
    measured_small[1] *= 3  # one round's small plan disturbed
    assert fit_action_compute(large, small, measured_large, measured_small) \
        == pytest.approx(k, rel=1e-9)
    assert action_compute(large) == pytest.approx((0.40, 16.0))
    with pytest.raises(ValueError, match="same number"):
        fit_action_compute(large, small, [1.0], [])


def test_the_cost_goes_into_every_compute_action_after_the_floor() -> None:
    """Each F and B pays it once, the update not; a single-process fit whose negative
    per-block cost put an action at its floor (a tenth of the blocks) still pays it in
    full, so that the fit's count of actions holds."""
    profile = small_profile(3, blocks=4)
    bounds = ((0, 2), (2, 4))
    floor = RuntimeCosts(per_block={"forward": -1.0})
    base = plan_costs(replace(profile, runtime=floor), bounds, Network(1e9))
    more = plan_costs(with_costs(replace(profile, runtime=floor), {PER_ACTION: 3e-3}), bounds,
                      Network(1e9))
    assert more.forward == pytest.approx([f + 3e-3 for f in base.forward])
    assert more.backward == pytest.approx([b + 3e-3 for b in base.backward])
    assert more.update == base.update
    assert RuntimeCosts.from_json(RuntimeCosts(compute_per_action=2e-3).to_json()) \
        .compute_per_action == 2e-3
    with pytest.raises(ValueError, match="compute_per_action must be a finite number"):
        RuntimeCosts(compute_per_action=-1e-3)


def _replay(plans: Mapping[str, CalibrationPlan], truth: Mapping[str, float],
            loads: tuple[float, ...], ranks: int) -> Callable[[str, Plan, int],
                                                               tuple[float, list[float]]]:
    """A runner that 'measures' each plan at ``truth``, round r at ``loads[r]``."""
    calls = {label: 0 for label in plans}

    def time_one(label: str, plan: Plan, steps: int) -> tuple[float, list[float]]:
        at = {**truth, "compute_scale": loads[calls[label]]}
        calls[label] += 1
        seen = plans[label].compute({**at, "action_overhead": 0.0})
        return plans[label].iteration(at), [seen / ranks] * ranks

    return time_one


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_calibration_fits_the_cost_with_the_other_parameters(ranks: int) -> None:
    """Runs 'measured' at a known compute per action, latencies and action overhead, each
    round at its own load: every value comes back and the fitted profile prices the small
    micro-batches as they ran. Without the compute per action (the fit before) the plan at
    the smallest micro-batches is predicted fast."""
    problem = _problem(ranks)
    plans = calibration_plans(problem)
    assert set(plans) == {"default", "data-parallel", "data-parallel-small"}
    truth = {PER_ACTION: 2e-3, "message_latency": 1e-3, "allreduce_latency": 5e-3,
             "action_overhead": 4e-4}
    loads = (1.3, 1.1, 1.5)
    fitted, fit = fit_calibration(problem, time_one=_replay(plans, truth, loads, ranks),
                                  rounds=3, seconds=0.1)
    assert fit is not None
    for name, value in truth.items():
        assert fit.fitted[name] == pytest.approx(value, rel=1e-4, abs=1e-9), name
    assert fit.fitted["compute_scale"] == pytest.approx(1.3, rel=1e-4)
    assert fit.to_json()[PER_ACTION] == fit.fitted[PER_ACTION]
    runtime = fitted.profile.runtime
    assert runtime is not None
    assert runtime.compute_per_action == pytest.approx(2e-3, rel=1e-4)
    small = plans["data-parallel-small"]
    ran = small.iteration({**truth, "compute_scale": 1.3})
    others = {name: value for name, value in fit.fitted.items() if name != PER_ACTION}
    candidate = data_parallel_candidate(fitted, small.plan.microbatches)
    assert candidate is not None
    scaled = scaled_profile(fitted.profile, fitted.batch // candidate.microbatches)
    assert simulate_candidate(candidate, scaled, fitted).iteration_time \
        == pytest.approx(ran, rel=1e-3)  # the fitted profile prices it as it ran
    assert small.iteration(others) < 0.95 * ran
    refit, again_fit = fit_calibration(fitted, time_one=_replay(plans, truth, loads, ranks),
                                       rounds=3, seconds=0.1)  # a calibrated profile again
    assert again_fit is not None and refit.profile.runtime is not None
    assert refit.profile.runtime.compute_per_action == pytest.approx(2e-3, rel=1e-4)


def test_not_fitted_where_the_ranks_share_cores() -> None:
    """Four ranks on two cores: the data-parallel plans' actions run time-sliced, which a
    pipeline does not pay per action, so the cost is left at 0 even where the runs say one
    (measure/calibration_sizes.py); the same runs on four cores fit it."""
    truth = {PER_ACTION: 2e-3, "message_latency": 1e-3, "allreduce_latency": 5e-3,
             "action_overhead": 4e-4}
    fitted: dict[int | None, float] = {}
    for cores in (None, 2):
        problem = replace(_problem(4), shared_cores=cores)
        plans = calibration_plans(problem)
        _, fit = fit_calibration(problem, time_one=_replay(plans, truth, (1.2, 1.2, 1.2), 4),
                                 rounds=3, seconds=0.1)
        assert fit is not None
        fitted[cores] = fit.fitted[PER_ACTION]
    assert fitted[None] == pytest.approx(2e-3, rel=1e-4)
    assert fitted[2] == 0.0


def test_dropped_where_it_prices_the_calibration_runs_worse() -> None:
    """Runs whose smallest micro-batches are slow for a reason that is not a cost per action
    (here the small plan alone runs 1.5x slower, time and compute): the closed form still
    gives a cost, but with it the default plan, which it was not fitted from, is priced far
    off (as gpt-small's at 2 ranks, 2026-11-27: 18.8 ms an action, the default predicted at
    368 ms where it ran 236), so the fit keeps the parameters without it."""
    problem = _problem(2)
    plans = calibration_plans(problem)
    truth = {PER_ACTION: 0.0, "message_latency": 1e-3, "allreduce_latency": 5e-3,
             "action_overhead": 0.0}
    honest = _replay(plans, truth, (1.2, 1.2, 1.2), 2)

    def slow_small(label: str, plan: Plan, steps: int) -> tuple[float, list[float]]:
        seconds, ranks = honest(label, plan, steps)
        factor = 1.5 if label == "data-parallel-small" else 1.0
        return seconds * factor, [r * factor for r in ranks]

    at = {**truth, "compute_scale": 1.2}
    assert round_action_compute(action_compute(plans["data-parallel"].compute),
                                action_compute(plans["data-parallel-small"].compute),
                                plans["data-parallel"].compute(at),
                                1.5 * plans["data-parallel-small"].compute(at)) > 1e-3
    _, fit = fit_calibration(problem, time_one=slow_small, rounds=3, seconds=0.1)
    assert fit is not None
    assert fit.fitted[PER_ACTION] == 0.0
