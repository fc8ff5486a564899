"""The calibration that fits the message latency and the all-reduce's fixed cost from
alternating runs of the default and a data-parallel plan (measure/calibration_runs.py), with
the runs replaced by times the model itself predicts at known parameters: the fit recovers
them. No timed assertion: nothing here runs a process."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import replace

import pytest

from auto_fixtures import small_profile
from pipeweave.auto import AutoProblem
from pipeweave.measure.alternating import alternate, round_steps
from pipeweave.measure.calibration_runs import (PARAMETERS, Target, calibration_plans,
                                                fit_calibration, solve, with_costs)
from pipeweave.planner.evaluate import Network, plan_costs
from pipeweave.planner.plan import Plan
from pipeweave.profiler import LinkProfile
from pipeweave.profiler.runtime_costs import RuntimeCosts


def test_solve_recovers_coupled_linear_parameters_exactly() -> None:
    """Two plans that each depend on both parameters: a = 1 + 2x + 0.5y, b = 3 + 0.3x + 4y."""
    x, y = 0.25, 0.125

    def a(t: Mapping[str, float]) -> float:
        return 1 + 2 * t["x"] + 0.5 * t["y"]

    def b(t: Mapping[str, float]) -> float:
        return 3 + 0.3 * t["x"] + 4 * t["y"]

    fitted = solve([Target("x", a, a({"x": x, "y": y})), Target("y", b, b({"x": x, "y": y}))])
    assert fitted["x"] == pytest.approx(x, rel=1e-9) and fitted["y"] == pytest.approx(y, rel=1e-9)


def test_solve_leaves_a_parameter_at_zero_when_its_plan_ran_faster() -> None:
    fitted = solve([Target("x", lambda t: 2 + t["x"], 1.5)])
    assert fitted == {"x": 0.0}


def _problem(ranks: int) -> AutoProblem:
    profile = replace(small_profile(5, blocks=8, link=LinkProfile(1e9, 1e-5)),
                      runtime=RuntimeCosts(per_message=2e-5, allreduce_bandwidth=3e8))
    return AutoProblem(profile=profile, ranks=ranks)


@pytest.mark.parametrize("ranks", [2, 4])
@pytest.mark.parametrize("latency, overhead, scale",
                         [(4e-4, 2e-3, 1.0), (0.0, 5e-3, 1.3), (1e-3, 0.0, 2.0)])
def test_the_fit_recovers_known_parameters(ranks: int, latency: float, overhead: float,
                                           scale: float) -> None:
    """The runs 'measure' what the model predicts at known parameters (their compute at a
    known scale): the fit finds them, each plan run in alternating rounds for the steps its
    predicted time asks."""
    problem = _problem(ranks)
    truth = {"message_latency": latency, "allreduce_latency": overhead, "compute_scale": scale}
    plans = calibration_plans(problem, actions=False)
    assert set(plans) == {"default", "data-parallel"}
    runs: list[tuple[str, int]] = []

    def time_one(label: str, plan: Plan, steps: int) -> tuple[float, list[float]]:
        assert plan == plans[label].plan
        runs.append((label, steps))
        per_rank = plans[label].compute(truth) / ranks
        return plans[label].iteration(truth), [per_rank] * ranks

    fitted, fit = fit_calibration(problem, time_one=time_one, rounds=3, seconds=0.5,
                                  actions=False)
    assert fit is not None
    assert [label for label, _ in runs] == ["default", "data-parallel", "data-parallel",
                                            "default", "default", "data-parallel"]
    for label, steps in runs:
        assert steps == round_steps(plans[label].predicted, seconds=0.5, steps=None)
    for name, value in truth.items():
        assert fit.fitted[name] == pytest.approx(value, rel=1e-6, abs=1e-12)
    for label, plan in plans.items():  # one set of parameters prices every plan as it ran
        assert fit.predicted_after[label] == pytest.approx(plan.iteration(truth), rel=1e-6)
        assert abs(fit.to_json()["plans"][label]["error_after"]) < 1e-6
    runtime = fitted.profile.runtime
    assert runtime is not None and runtime.message_latency == fit.fitted["message_latency"]
    assert runtime.allreduce_latency == fit.fitted["allreduce_latency"]
    assert runtime.compute_scale == fit.fitted["compute_scale"]
    assert runtime.per_message == 2e-5 and runtime.allreduce_bandwidth == 3e8
    report = fit.to_json()
    assert report["plans"]["data-parallel"]["rounds"] == [plans["data-parallel"].iteration(truth)] * 3
    assert report["plans"]["default"]["spread"] == 0.0


def test_a_plan_s_scale_is_the_median_of_its_rounds() -> None:
    """Per round a plan's own scale (measure/calibration_rounds.py): 0.8 where the runs
    computed faster than simulated (the profile's blocks take it, below 1); the fitted scale
    is the median over the rounds, so one round 9x slow does not move it."""
    from pipeweave.measure.calibration_rounds import fit_rounds

    plans = {"default": calibration_plans(_problem(2))["default"]}
    simulated = plans["default"].compute({})
    iteration = plans["default"].iteration({})
    slower = fit_rounds(plans, PARAMETERS, {"default": [iteration]},
                        {"default": [simulated * 0.8]})
    # 0.8 of the blocks' times, the runtime's fixed costs per action unscaled: close to 0.8
    assert slower.fitted["compute_scale"] == pytest.approx(0.8, rel=1e-3)
    rounds = [simulated * 1.5, simulated * 1.2, simulated * 9]  # the median: 1.5
    fitted = fit_rounds(plans, PARAMETERS, {"default": [iteration * 2] * 3}, {"default": rounds})
    assert fitted.fitted["compute_scale"] == pytest.approx(1.5, rel=1e-6)


def test_without_the_allreduce_bandwidth_only_the_message_latency_is_fitted() -> None:
    problem = _problem(2)
    problem = replace(problem, profile=with_costs(problem.profile, {}))
    runtime = problem.profile.runtime
    assert runtime is not None
    problem = replace(problem, profile=replace(problem.profile, runtime=replace(
        runtime, allreduce_bandwidth=None)))
    assert set(calibration_plans(problem)) == {"default"}


def test_the_compute_scale_multiplies_compute_actions_only() -> None:
    """F, B (and I, W) x scale, with the sends they post; the update is not compute."""
    profile = small_profile(3, blocks=4)
    bounds = ((0, 2), (2, 4))
    base = replace(profile, runtime=RuntimeCosts(per_message=1e-4))
    scaled = replace(profile, runtime=RuntimeCosts(per_message=1e-4, compute_scale=1.5))
    one, two = plan_costs(base, bounds, Network(1e9)), plan_costs(scaled, bounds, Network(1e9))
    assert two.forward == pytest.approx([f * 1.5 for f in one.forward])
    assert two.backward == pytest.approx([b * 1.5 for b in one.backward])
    assert two.update == one.update
    with pytest.raises(ValueError, match="compute_scale must be a finite number >= 1"):
        RuntimeCosts(compute_scale=0.5)


def test_the_allreduce_is_priced_as_measured_and_never_below_the_ring() -> None:
    """Hand-derived: r = 3, |w| = stage bytes: latency + 2 |w| / 3e8 where that exceeds the
    ring's 4 (2/3) |w| / 1e9; without a bandwidth the ring plus 2 (r-1) message latencies."""
    profile = small_profile(3, blocks=4)
    bounds, replicas = ((0, 2), (2, 4)), (1, 3)
    network = Network(bandwidth=1e9, latency=1e-5)
    plain = plan_costs(profile, bounds, network, replicas=replicas)
    measured = replace(profile, runtime=RuntimeCosts(allreduce_latency=1e-3,
                                                     allreduce_bandwidth=3e8,
                                                     message_latency=5e-4))
    costs = plan_costs(measured, bounds, network, replicas=replicas)
    size = profile.stage_parameter_bytes(2, 4)
    assert costs.all_reduce[0] == 0.0
    assert costs.all_reduce[1] == pytest.approx(1e-3 + 2 * size / 3e8)
    assert 2 * size / 3e8 > plain.all_reduce[1]
    fast = replace(profile, runtime=RuntimeCosts(allreduce_latency=1e-3, allreduce_bandwidth=1e12))
    assert plan_costs(fast, bounds, network, replicas=replicas).all_reduce[1] == \
        pytest.approx(1e-3 + plain.all_reduce[1])


def test_alternate_refuses_no_rounds_and_honours_fixed_steps() -> None:
    plan = Plan(num_blocks=2, stages=((0, 1), (1, 2)), schedule="1f1b", microbatches=2)
    with pytest.raises(ValueError, match="--rounds must be >= 1"):
        alternate({"a": (plan, 0.1)}, rounds=0, seconds=1.0, steps=None,
                  time_one=lambda label, p, steps: 0.1)
    seen = []
    done = alternate({"a": (plan, 0.1), "b": (plan, 0.01)}, rounds=2, seconds=1.0, steps=7,
                     time_one=lambda label, p, steps: seen.append(steps) or 0.1 * len(seen))
    assert seen == [7, 7, 7, 7]
    assert done["a"].times == pytest.approx((0.1, 0.4)) and done["b"].times == pytest.approx((0.2, 0.3))
    assert done["a"].spread == pytest.approx(0.3 / 0.25)
    assert round_steps(0.01, seconds=1.0, steps=None) == 101
    assert round_steps(1e-6, seconds=1.0, steps=None) == 400


def test_the_run_report_is_the_median_of_the_rounds_against_the_prediction() -> None:
    """``auto --run``'s comparison (measure/compare.py) from given rounds: the median, its
    error against the prediction, samples/s at the median, the spread."""
    from pipeweave.auto.search import default_prediction
    from pipeweave.measure.alternating import Rounds
    from pipeweave.measure.compare import compare_predictions

    prediction = default_prediction(_problem(2))
    assert prediction is not None
    predicted = prediction.iteration_time
    rounds = Rounds((predicted * 1.3, predicted * 1.1, predicted * 0.9), steps=12)
    report = compare_predictions({"default": prediction}, rounds={"default": rounds},
                                 memory={"default": [5, 6]}, batch_size=8)["default"]
    assert report["iteration_time"] == pytest.approx(predicted * 1.1)
    assert report["iteration_time_error"] == pytest.approx(0.1 / 1.1)
    assert report["samples_per_second"] == pytest.approx(8 / (predicted * 1.1))
    assert report["spread"] == pytest.approx(0.4 / 1.1)
    assert report["rounds"] == list(rounds.times) and report["steps_per_round"] == 12
    assert report["peak_memory_bytes"] == [5, 6]
    assert report["predicted_iteration_time"] == predicted
    assert "busy_fraction" not in report  # no compute measured
    compute = [0.5 * predicted, 0.2 * predicted, 0.9 * predicted]  # over 2 ranks
    busy = compare_predictions({"default": prediction}, rounds={"default": rounds},
                               memory={}, batch_size=8, compute={"default": compute},
                               ranks={"default": 2})["default"]
    assert busy["compute_seconds"] == compute
    assert busy["busy_fraction"] == pytest.approx(statistics.median(
        [0.5 / 2.6, 0.2 / 2.2, 0.9 / 1.8]))
    assert busy["predicted_busy_fraction"] == pytest.approx(1 - prediction.bubble_fraction)


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_the_allreduce_timing_fits_a_bandwidth() -> None:
    """Two real processes time the runtime's all-gather and sum at three sizes: a line with
    a positive bandwidth and latency comes out (its values depend on the machine)."""
    from pipeweave.measure.collective import measure_allreduce

    fitted = measure_allreduce(sizes=(1 << 12, 1 << 18, 1 << 21), repeats=3)
    assert fitted.bandwidth > 0 and fitted.latency >= 0


def test_the_measured_table_gives_the_spread_and_the_rounds() -> None:
    from pipeweave.cli.cmd_auto import format_measured

    row = {"predicted_peak_memory_bytes": [2**20], "peak_memory_bytes": [2 * 2**20],
           "predicted_iteration_time": 0.02, "iteration_time": 0.025,
           "iteration_time_error": 0.2, "spread": 0.125, "rounds": [0.024, 0.025, 0.027]}
    text = format_measured({"measured": {"winner": row}})
    assert "20.0%" in text and "12.5%" in text and "1.0/2.0" in text
    assert "median of 3 alternating rounds" in text


def _shared_problem(ranks: int, cores: int) -> AutoProblem:
    """A batch of 8 x ranks samples, so that every M the search tries divides it."""
    return replace(_problem(ranks), shared_cores=cores, batch_size=8 * ranks)


@pytest.mark.parametrize("ranks, overhead, latency, reduce, scale",
                         [(4, 5e-4, 1e-3, 2e-3, 1.2), (3, 2e-3, 3e-4, 4e-3, 1.1),
                          (4, 0.0, 5e-4, 1e-3, 1.5)])
def test_shared_cores_add_a_plan_at_the_smallest_micro_batches_and_fit_the_action_cost(
        ranks: int, overhead: float, latency: float, reduce: float, scale: float) -> None:
    """Ranks > cores: a third plan, data-parallel at the search's largest M (8 x ranks),
    fixes the per-action overhead; the runs 'measure' what the model predicts at known
    parameters, their timelines' compute without the overhead (it lies between actions):
    all four come back."""
    problem = _shared_problem(ranks, 2)
    plans = calibration_plans(problem)
    assert set(plans) == {"default", "data-parallel", "data-parallel-small"}
    assert plans["data-parallel-small"].plan.microbatches == 8 * ranks
    assert plans["data-parallel"].plan.microbatches == 2 * ranks
    truth = {"message_latency": latency, "allreduce_latency": reduce,
             "action_overhead": overhead, "compute_scale": scale}

    def time_one(label: str, plan: Plan, steps: int) -> tuple[float, list[float]]:
        seen = plans[label].compute({**truth, "action_overhead": 0.0})
        return plans[label].iteration(truth), [seen / ranks] * ranks

    fitted, fit = fit_calibration(problem, time_one=time_one, rounds=1, seconds=0.1)
    assert fit is not None
    for name, value in truth.items():
        assert fit.fitted[name] == pytest.approx(value, rel=1e-6, abs=1e-10)
    runtime = fitted.profile.runtime
    assert runtime is not None and runtime.action_overhead == fit.fitted["action_overhead"]
    assert fit.to_json()["plans"]["data-parallel-small"]["parameter"] == "action_overhead"


def test_no_action_plan_where_no_larger_m_fits_or_not_asked() -> None:
    """Every rank count gets the plan at the smallest micro-batches where a larger M than
    the default's fits (its compute against the data-parallel plan's fixes the compute
    per action, measure/calibration_sizes.py), not only ranks sharing cores."""
    assert "data-parallel-small" not in calibration_plans(_problem(4), actions=False)
    assert calibration_plans(_problem(4))["data-parallel-small"].plan.microbatches == 16
    assert calibration_plans(_problem(2))["data-parallel-small"].plan \
        .microbatches == 8  # the batch is 8 samples: 4 x 2 ranks is the largest M dividing it
    fixed = replace(_shared_problem(4, 2), microbatches=(4, 8))
    assert "data-parallel-small" not in calibration_plans(fixed)
    wanted = replace(_shared_problem(4, 2), microbatches=(8, 16))
    assert calibration_plans(wanted)["data-parallel-small"].plan.microbatches == 16


def test_the_action_overhead_is_added_to_each_compute_action_and_each_send() -> None:
    """Hand-derived on two stages: F0 sends forward, B1 sends back; each pays the overhead
    twice, the others once; the update not at all; after the compute scale."""
    profile = small_profile(3, blocks=4)
    bounds = ((0, 2), (2, 4))
    base = replace(profile, runtime=RuntimeCosts(per_message=1e-4, compute_scale=1.5))
    more = replace(profile, runtime=RuntimeCosts(per_message=1e-4, compute_scale=1.5,
                                                 action_overhead=1e-3))
    one, two = plan_costs(base, bounds, Network(1e9)), plan_costs(more, bounds, Network(1e9))
    assert [b - a for a, b in zip(one.forward, two.forward)] == pytest.approx([2e-3, 1e-3])
    assert [b - a for a, b in zip(one.backward, two.backward)] == pytest.approx([1e-3, 2e-3])
    assert [b - a for a, b in zip(one.input_grad, two.input_grad)] == pytest.approx([1e-3, 2e-3])
    assert two.update == one.update
    assert RuntimeCosts.from_json(more.runtime.to_json()) == more.runtime
    with pytest.raises(ValueError, match="action_overhead must be a finite number"):
        RuntimeCosts(action_overhead=-1e-3)


def test_one_timer_serves_the_calibration_and_auto_run_with_apc_per_label(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``plan_timer`` passes each label's APC setting to ``measure_plan`` (no memory run);
    ``measure_predictions`` times its rounds through it."""
    from pipeweave.auto.search import default_prediction
    from pipeweave.measure import compare, plan_run
    from pipeweave.measure.plan_run import Measured

    calls: list[tuple[int, bool, bool]] = []

    def fake(plan: Plan, *, apc: bool = False, memory: bool = True, **_: object) -> Measured:
        calls.append((plan.microbatches, apc, memory))
        return Measured(0.01 * plan.microbatches, [], 1.0, [], [0.002, 0.003])

    monkeypatch.setattr(plan_run, "measure_plan", fake)
    monkeypatch.setattr(compare, "peak_memory", lambda plan, **_: [1, 2])
    timer = plan_run.plan_timer(model="toy", batch_size=8, apc={"winner": True})
    plan = Plan(num_blocks=2, stages=((0, 1), (1, 2)), schedule="1f1b", microbatches=4)
    assert timer("winner", plan, 5) == (0.04, [0.002, 0.003])
    assert timer("default", plan, 5)[0] == 0.04
    assert calls == [(4, True, False), (4, False, False)]
    prediction = default_prediction(_problem(2))
    assert prediction is not None
    calls.clear()
    report = compare.measure_predictions({"default": prediction}, model="toy", batch_size=8,
                                         rounds=2, steps=3)
    assert calls == [(prediction.plan.microbatches, False, False)] * 2
    assert report["default"]["iteration_time"] == pytest.approx(0.01 * prediction.plan.microbatches)
    assert report["default"]["peak_memory_bytes"] == [1, 2]
    assert report["default"]["compute_seconds"] == pytest.approx([0.005, 0.005])
    assert report["default"]["busy_fraction"] == pytest.approx(
        0.005 / (2 * 0.01 * prediction.plan.microbatches))
