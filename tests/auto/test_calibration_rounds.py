"""The calibration fitted round by round (measure/calibration_rounds.py), on synthetic runs:
each round 'measures' what the model predicts at known parameters, every plan at its own
compute speed that round (a load that moves from round to round and plan to plan), with
noise added and one disturbed round. No process runs."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import replace

import pytest

from auto_fixtures import replayed, small_profile
from pipeweave.auto import AutoProblem
from pipeweave.measure.calibration_rounds import (SCALE_FLOOR, fit_rounds, round_targets,
                                                  scale_name)
from pipeweave.measure.calibration_runs import (PARAMETERS, CalibrationPlan, calibration_plans,
                                                fit_calibration, solve, with_fit)
from pipeweave.profiler import LinkProfile
from pipeweave.profiler.runtime_costs import RuntimeCosts

TRUTH = {"message_latency": 3e-3, "allreduce_latency": 2e-2}
"""Large enough beside the noise to be told apart: the plans' iterations are 0.16-0.17 s at
scale 1, the message latency adds some 4 of its values to the default, the all-reduce's cost
once to the data-parallel plan."""
SCALES = {"default": (1.05, 1.30, 1.10, 1.45, 1.20),
          "data-parallel": (1.60, 1.15, 1.50, 1.25, 1.70)}
"""Each plan's compute speed in each of five rounds: the plans never ran at one speed."""
NOISE = (0.006, -0.01, 0.003, 0.01, -0.004)
"""Relative noise of each round's iteration time (a different sign per plan, below)."""


def _problem(ranks: int = 2) -> AutoProblem:
    profile = replace(small_profile(5, blocks=8, link=LinkProfile(1e9, 1e-5)),
                      runtime=RuntimeCosts(per_message=2e-5, allreduce_bandwidth=3e8))
    return AutoProblem(profile=profile, ranks=ranks)


def _runs(plans: Mapping[str, CalibrationPlan], *, disturbed: float = 1.0,
          speeds: Mapping[str, tuple[float, ...]] | None = None
          ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per plan, five rounds' iteration and compute seconds at :data:`TRUTH`, each at its
    round's scale, with :data:`NOISE`; round 3's data-parallel iteration x ``disturbed``
    (a stall outside compute: its timeline's compute does not move); ``speeds``: other
    scales per round for some plans."""
    times: dict[str, list[float]] = {}
    compute: dict[str, list[float]] = {}
    scales = {**SCALES, **dict(speeds or {})}
    for sign, label in zip((1, -1), plans):
        at = [{**TRUTH, "compute_scale": scale} for scale in scales[label]]
        times[label] = [plans[label].iteration(v) * (1 + sign * e) for v, e in zip(at, NOISE)]
        compute[label] = [plans[label].compute(v) * (1 - sign * e / 2) for v, e in zip(at, NOISE)]
    times["data-parallel"][2] *= disturbed
    return times, compute


def test_each_plan_at_its_own_speed_recovers_the_latencies_despite_noise_and_a_bad_round(
        ) -> None:
    """Noise of up to 1 % per round (some 2 ms of a 0.2 s iteration) and one data-parallel
    round 3x slow (outside compute): both latencies within 15 % of the truth (in one round a
    1 % error of an iteration is a tenth of the all-reduce's cost and, over the default's
    some four messages, a sixth of the message latency), the compute scale within 5 % of the
    median speed. A mean over the rounds puts the all-reduce's cost several times too high;
    one scale shared by both plans (the fit before) misplaces the message latency."""
    plans = calibration_plans(_problem(), actions=False)
    assert set(plans) == {"default", "data-parallel"}
    times, compute = _runs(plans, disturbed=3.0)
    found = fit_rounds(plans, PARAMETERS, times, compute)
    for name, value in TRUTH.items():
        assert found.fitted[name] == pytest.approx(value, rel=0.15), name
    every = [s for scales in SCALES.values() for s in scales]
    assert found.fitted["compute_scale"] == pytest.approx(statistics.median(every), rel=0.05)
    assert len(found.rounds) == 5
    for one, default, parallel in zip(found.rounds, *SCALES.values()):
        assert one[scale_name("default")] == pytest.approx(default, rel=0.03)
        assert one[scale_name("data-parallel")] == pytest.approx(parallel, rel=0.03)

    mean = statistics.fmean(one["allreduce_latency"] for one in found.rounds)
    assert abs(mean - TRUTH["allreduce_latency"]) > 1.0 * TRUTH["allreduce_latency"]

    shared = _shared_scale_fit(plans, times, compute)
    assert abs(shared["message_latency"] - TRUTH["message_latency"]) \
        > 0.25 * TRUTH["message_latency"]


def _shared_scale_fit(plans: Mapping[str, CalibrationPlan], times: Mapping[str, list[float]],
                      compute: Mapping[str, list[float]]) -> dict[str, float]:
    """The fit before: one scale for the plans' summed median compute, each parameter at
    its plan's median time (for the test's contrast only)."""
    from pipeweave.measure.calibration_solve import Target

    def simulated(values: Mapping[str, float]) -> float:
        return sum(plans[label].compute({**values, "action_overhead": 0.0}) for label in plans)

    targets = [Target("compute_scale", simulated,
                      sum(statistics.median(compute[label]) for label in plans), least=1.0)]
    targets += [Target(PARAMETERS[label], plans[label].iteration,
                       statistics.median(times[label])) for label in plans]
    return solve(targets)


def test_without_noise_every_round_finds_the_truth_exactly() -> None:
    plans = calibration_plans(_problem(), actions=False)
    times: dict[str, list[float]] = {}
    compute: dict[str, list[float]] = {}
    for label in plans:
        at = [{**TRUTH, "compute_scale": scale} for scale in SCALES[label]]
        times[label] = [plans[label].iteration(v) for v in at]
        compute[label] = [plans[label].compute(v) for v in at]
    found = fit_rounds(plans, PARAMETERS, times, compute)
    for one in found.rounds:
        for name, value in TRUTH.items():
            assert one[name] == pytest.approx(value, rel=1e-6)


def test_a_plan_computing_faster_than_its_profile_gets_a_scale_below_one() -> None:
    """The runs computed at 0.8 of the profile and spent 3 ms a message outside compute: a
    scale held at 1 would leave the message latency at a third of that (the compute's
    overestimate eats it); down to the floor, no lower."""
    plans = calibration_plans(_problem(), actions=False)
    default = plans["default"]
    at = {"compute_scale": 0.8, "message_latency": 3e-3}
    targets = round_targets({"default": default}, PARAMETERS, {"default": default.iteration(at)},
                            {"default": default.compute(at)})
    fitted = solve(targets)
    assert fitted[scale_name("default")] == pytest.approx(0.8, rel=1e-6)
    assert fitted["message_latency"] == pytest.approx(3e-3, rel=1e-6)
    held = solve([replace(t, least=1.0) if t.parameter == scale_name("default") else t
                  for t in targets])
    assert held["message_latency"] < 0.5 * 3e-3
    floor = round_targets({"default": default}, PARAMETERS, {"default": default.iteration({})},
                          {"default": default.compute({}) * 0.01})
    assert solve(floor)[scale_name("default")] == SCALE_FLOOR


def test_a_scale_below_one_goes_into_every_profile_s_blocks() -> None:
    """The runtime's scale stays >= 1 (bounds from the profile's times stay bounds); the
    blocks of the profile and of the other sizes' profiles compute at 0.8; the update not."""
    problem = replace(_problem(), extra_profiles=(small_profile(5, blocks=8, batch_size=4),))
    costs = RuntimeCosts(per_action={"forward": 1e-3, "update": 2e-3},
                         per_block={"backward": 4e-4}, per_message=2e-5, allreduce_bandwidth=3e8)
    problem = replace(problem, profile=replace(problem.profile, runtime=costs))
    fitted = with_fit(problem, {"compute_scale": 0.8, "message_latency": 1e-3})
    runtime = fitted.profile.runtime
    assert runtime is not None and runtime.compute_scale == 1.0
    assert runtime.message_latency == 1e-3 and runtime.per_message == 2e-5
    # the runtime's fixed costs of compute actions are compute too (what the scale multiplies)
    assert runtime.per_action == pytest.approx({"forward": 0.8e-3, "update": 2e-3})
    assert runtime.per_block == pytest.approx({"backward": 0.8 * 4e-4})
    for before, after in ((problem.profile, fitted.profile),
                          (problem.extra_profiles[0], fitted.extra_profiles[0])):
        for old, new in zip(before.blocks, after.blocks):
            assert (new.forward, new.backward) == pytest.approx((0.8 * old.forward,
                                                                 0.8 * old.backward))
            assert new.update == old.update
    same = with_fit(problem, {"compute_scale": 1.2})
    assert same.profile.blocks == problem.profile.blocks
    assert same.profile.runtime is not None and same.profile.runtime.compute_scale == 1.2


def test_rounds_must_pair_up() -> None:
    plans = calibration_plans(_problem(), actions=False)
    with pytest.raises(ValueError, match="same number"):
        fit_rounds(plans, PARAMETERS, {"default": [0.1, 0.1], "data-parallel": [0.1]},
                   {"default": [0.1, 0.1], "data-parallel": [0.1]})


def test_fit_calibration_reports_each_rounds_fit() -> None:
    """The runner's rounds reach the fit in order: per-round scales and latencies in the
    report, the medians in the profile."""
    problem = _problem()
    plans = calibration_plans(problem, actions=False)
    # the default computes at the data-parallel plan's speed of its round (it borrows it,
    # calibration_runs._borrowed), its received messages costing nothing extra here
    times, compute = _runs(plans, speeds={"default": SCALES["data-parallel"]})
    fitted, fit = fit_calibration(problem, time_one=replayed(times, compute, 2), rounds=5,
                                  seconds=0.1, actions=False)
    assert fit is not None and len(fit.rounds) == 5
    report = fit.to_json()
    assert [one[scale_name("data-parallel")] for one in report["per_round"]] == \
        pytest.approx(SCALES["data-parallel"], rel=0.03)
    assert scale_name("default") not in report["per_round"][0]
    assert report["compute_per_receive"] == pytest.approx(0.0, abs=2e-4)
    runtime = fitted.profile.runtime
    assert runtime is not None
    assert runtime.message_latency == pytest.approx(TRUTH["message_latency"], rel=0.15)
    assert runtime.compute_scale == fit.fitted["compute_scale"]
