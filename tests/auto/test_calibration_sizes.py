"""The compute scale by micro-batch size (measure/calibration_sizes.py), fitted from the
calibration's data-parallel plans at two sizes, on synthetic runs that 'measure' what the
model predicts at known parameters; and the fixed compute per action a saved profile may
carry (RuntimeCosts.compute_per_action), which the planner still applies. No process runs."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace

import pytest

from auto_fixtures import small_profile
from pipeweave.auto import AutoProblem
from pipeweave.measure.calibration_rounds import PER_RECEIVE
from pipeweave.measure.calibration_runs import (CalibrationPlan, calibration_plans,
                                                fit_calibration, with_costs)
from pipeweave.measure.calibration_sizes import PER_ACTION, size_scale_values
from pipeweave.planner.evaluate import Network, plan_costs
from pipeweave.planner.plan import Plan
from pipeweave.profiler import LinkProfile
from pipeweave.profiler.runtime_costs import RuntimeCosts


def _problem(ranks: int = 2) -> AutoProblem:
    profile = replace(small_profile(5, blocks=8, link=LinkProfile(1e9, 1e-5)),
                      runtime=RuntimeCosts(per_action={"forward": 1e-4, "update": 2e-4},
                                           per_message=2e-5, allreduce_bandwidth=3e8))
    return AutoProblem(profile=profile, ranks=ranks)


def test_the_scale_by_size_is_the_median_per_size_over_the_least() -> None:
    rounds = [{"compute_scale@a": 1.2, "compute_scale@b": 0.8},
              {"compute_scale@a": 1.0, "compute_scale@b": 0.7},
              {"compute_scale@a": 1.4, "compute_scale@b": 3.0}]  # b's third round disturbed
    assert size_scale_values({"a": 4, "b": 1}, rounds) == pytest.approx(
        {"compute_scale": 0.8, "size_scale@1": 1.0, "size_scale@4": 1.5})
    assert size_scale_values({"a": 4}, rounds) == {}  # one size: one scale serves


def test_the_factor_is_linear_in_the_log_of_the_size_between_two_sizes() -> None:
    costs = RuntimeCosts(size_scales=((1, 1.0), (4, 1.5)))
    assert [costs.size_factor(m) for m in (1, 2, 4, 8)] == pytest.approx([1.0, 1.25, 1.5, 1.5])
    assert costs.size_factor(None) == 1.0 and RuntimeCosts().size_factor(3) == 1.0
    assert RuntimeCosts.from_json(costs.to_json()) == costs
    for bad, match in ((((0, 1.0),), "size_scales entry"), (((2, 0.5),), "size_scales entry"),
                       (((2, math.nan),), "size_scales entry"),
                       (((2, 1.0), (2, 1.2)), "name a size twice")):
        with pytest.raises(ValueError, match=match):
            RuntimeCosts(size_scales=bad)


def test_a_size_s_factor_multiplies_its_compute_actions_only() -> None:
    """F and B of a stage at a size with factor 1.5 cost 1.5x; the update does not move."""
    profile = replace(small_profile(3, blocks=4), batch_size=4)
    bounds = ((0, 2), (2, 4))
    plain = plan_costs(replace(profile, runtime=RuntimeCosts()), bounds, Network(1e9))
    sized = plan_costs(replace(profile, runtime=RuntimeCosts(size_scales=((1, 1.0), (4, 1.5)))),
                       bounds, Network(1e9))
    assert sized.forward == pytest.approx([1.5 * f for f in plain.forward])
    assert sized.backward == pytest.approx([1.5 * b for b in plain.backward])
    assert sized.update == plain.update


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
            loads: tuple[float, ...], ranks: int,
            sizes: Mapping[str, float] | None = None) -> Callable[[str, Plan, int],
                                                                  tuple[float, list[float]]]:
    """A runner that 'measures' each plan at ``truth``, round r at ``loads[r]`` times the
    plan's ``sizes[label]`` (default 1)."""
    calls = {label: 0 for label in plans}

    def time_one(label: str, plan: Plan, steps: int) -> tuple[float, list[float]]:
        at = {**truth, "compute_scale": loads[calls[label]] * (sizes or {}).get(label, 1.0)}
        calls[label] += 1
        seen = plans[label].compute({**at, "action_overhead": 0.0})
        return plans[label].iteration(at), [seen / ranks] * ranks

    return time_one


@pytest.mark.parametrize("ranks", [2, 4])
def test_the_calibration_fits_the_scale_by_size_with_the_other_parameters(ranks: int) -> None:
    """Runs 'measured' with the smallest micro-batches at 0.7 of the default size's speed,
    each round at its own load, the default plan at the data-parallel plan's speed plus a
    cost per received message: every value comes back, and one set of parameters prices
    each calibration plan as it ran (the median of both sizes' scales, the fit before,
    prices the small plan slow and the default-size plans fast)."""
    problem = _problem(ranks)
    plans = calibration_plans(problem)
    assert set(plans) == {"default", "data-parallel", "data-parallel-small"}
    truth = {"message_latency": 1e-3, "allreduce_latency": 5e-3, "action_overhead": 4e-4,
             PER_RECEIVE: 3e-4}
    loads = (1.3, 1.1, 1.5)
    replay = _replay(plans, truth, loads, ranks, {"data-parallel-small": 0.7})
    fitted, fit = fit_calibration(problem, time_one=replay, rounds=3, seconds=0.1)
    assert fit is not None
    for name, value in truth.items():
        assert fit.fitted[name] == pytest.approx(value, rel=1e-4, abs=1e-9), name
    small = problem.batch // plans["data-parallel-small"].plan.microbatches
    large = problem.batch // plans["data-parallel"].plan.microbatches
    assert fit.fitted["compute_scale"] == pytest.approx(0.7 * 1.3, rel=1e-4)
    assert fit.fitted[f"size_scale@{small}"] == pytest.approx(1.0)
    assert fit.fitted[f"size_scale@{large}"] == pytest.approx(1 / 0.7, rel=1e-4)
    assert fit.fitted[PER_ACTION] == 0.0
    runtime = fitted.profile.runtime
    assert runtime is not None and [m for m, _ in runtime.size_scales] == [small, large]
    assert [f for _, f in runtime.size_scales] == pytest.approx([1.0, 1 / 0.7], rel=1e-4)
    for label, plan in plans.items():
        speed = 1.3 * (0.7 if label == "data-parallel-small" else 1.0)
        ran = plan.iteration({**truth, "compute_scale": speed})
        # within 1 %: a scale below 1 goes into the blocks but not into posting a send
        # (calibration_runs.compute_faster), which the size's factor still multiplies
        assert fit.predicted_after[label] == pytest.approx(ran, rel=1e-2), label
        one_scale = {**truth, "compute_scale": (0.7 * 1.3 + 1.3) / 2}
        if label == "data-parallel-small":
            assert plan.iteration(one_scale) > 1.05 * ran
        else:
            assert plan.iteration(one_scale) < 0.97 * ran


def test_one_size_keeps_one_scale() -> None:
    """Without the smallest-micro-batch plan there is one size: no table, the median scale."""
    problem = _problem(2)
    plans = calibration_plans(problem, actions=False)
    truth = {"message_latency": 1e-3, "allreduce_latency": 5e-3}
    fitted, fit = fit_calibration(problem, time_one=_replay(plans, truth, (1.2, 1.4, 1.3), 2),
                                  rounds=3, seconds=0.1, actions=False)
    assert fit is not None and not any(name.startswith("size_scale@") for name in fit.fitted)
    assert fit.fitted["compute_scale"] == pytest.approx(1.3, rel=1e-4)
    assert fitted.profile.runtime is not None and fitted.profile.runtime.size_scales == ()
