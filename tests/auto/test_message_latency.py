"""The message latency fitted from one real run of the default plan (measure/message_latency.py), with
the run replaced by a given time: after the fit the simulated default plan takes that time."""

from __future__ import annotations

from dataclasses import replace

import pytest

from auto_fixtures import small_profile
from pipeweave.auto import AutoProblem
from pipeweave.auto.search import default_prediction
from pipeweave.measure import fit_message_latency
from pipeweave.planner.evaluate import Network, plan_costs
from pipeweave.profiler import LinkProfile
from pipeweave.profiler.runtime_costs import RuntimeCosts


def _problem(ranks: int = 2) -> AutoProblem:
    return AutoProblem(profile=small_profile(5, blocks=6, link=LinkProfile(1e9, 1e-5)),
                       ranks=ranks)


@pytest.mark.parametrize("slower", [1.05, 1.5, 3.0])
def test_fitted_latency_makes_the_default_plan_time_as_measured(slower: float) -> None:
    problem = _problem()
    before = default_prediction(problem)
    assert before is not None
    seen = []

    def measure(plan: object, batch: int) -> float:
        seen.append((plan, batch))
        return before.iteration_time * slower

    fitted, fit = fit_message_latency(problem, model="toy", measure=measure)
    assert fit is not None and seen == [(before.plan, problem.batch)]
    assert fit.message_latency > 0 and fit.predicted_before == pytest.approx(before.iteration_time)
    after = default_prediction(fitted)
    assert after is not None
    assert after.iteration_time == pytest.approx(before.iteration_time * slower, rel=1e-6)
    assert fitted.profile.runtime is not None
    assert fitted.profile.runtime.message_latency == fit.message_latency


def test_a_faster_run_leaves_the_latency_at_zero() -> None:
    problem = _problem()
    before = default_prediction(problem)
    assert before is not None
    fitted, fit = fit_message_latency(problem, model="toy",
                                      measure=lambda plan, batch: before.iteration_time / 2)
    assert fit is not None and fit.message_latency == 0.0
    assert fitted.profile.runtime is not None and fitted.profile.runtime.message_latency == 0.0


def test_one_rank_has_no_message_to_put_the_gap_on() -> None:
    problem = _problem(ranks=1)
    before = default_prediction(problem)
    assert before is not None
    _, fit = fit_message_latency(problem, model="toy",
                                 measure=lambda plan, batch: before.iteration_time * 2)
    assert fit is not None and fit.message_latency == 0.0


def test_message_latency_is_added_to_transfers_and_ring_steps() -> None:
    """Hand-derived: every transfer's latency + L, each replicated stage's all-reduce + 2 (r-1) L."""
    profile = small_profile(3, blocks=4)
    slow = replace(profile, runtime=RuntimeCosts(message_latency=2e-3))
    network = Network(bandwidth=1e9, latency=1e-5)
    plain = plan_costs(profile, ((0, 2), (2, 4)), network, replicas=(1, 3))
    costs = plan_costs(slow, ((0, 2), (2, 4)), network, replicas=(1, 3))
    assert costs.latency == pytest.approx(1e-5 + 2e-3)
    assert costs.all_reduce[0] == pytest.approx(plain.all_reduce[0])
    assert costs.all_reduce[1] == pytest.approx(plain.all_reduce[1] + 2 * 2 * 2e-3)
    assert costs.forward == plain.forward and costs.backward == plain.backward


def test_calibration_runs_last_about_a_second() -> None:
    from pipeweave.measure import TIMED_SECONDS, timed_steps

    assert TIMED_SECONDS == 1.0
    assert timed_steps(0.3) == 6            # at least 6 (a slow model: 1.5 s timed)
    assert timed_steps(0.01) == 101         # 100 timed iterations of 10 ms, and the warm-up
    assert timed_steps(1e-6) == 200         # at most 200
    assert timed_steps(0.0) == 6


@pytest.mark.parametrize("ranks, blocks, slower", [(2, 6, 1.5), (4, 12, 3.0)])
def test_the_fit_equals_bisecting_whole_predictions(ranks: int, blocks: int,
                                                    slower: float) -> None:
    """Each probe simulates the default plan partitioned once (``default_plan_time``): the
    same numbers as a whole ``default_prediction`` per probe (partition, simulation, memory
    model), and so the same fitted latency, to the last bit."""
    from pipeweave.measure import default_plan_time, with_message_latency
    from pipeweave.measure.message_latency import _bisect

    problem = _problem(ranks)
    problem = replace(problem, profile=replace(small_profile(7, blocks=blocks,
                                                             link=LinkProfile(1e9, 1e-5)),
                                               runtime=RuntimeCosts(per_message=2e-5)))

    def whole(latency: float) -> float:
        found = default_prediction(replace(problem, profile=with_message_latency(
            problem.profile, latency=latency)))
        assert found is not None
        return found.iteration_time

    found = default_plan_time(problem)
    assert found is not None
    before, probe = found
    for latency in (0.0, 1e-6, 3e-4, 2e-2):
        assert probe(latency) == whole(latency)
    measured = before.iteration_time * slower
    _, fit = fit_message_latency(problem, model="toy", measure=lambda plan, batch: measured)
    assert fit is not None and fit.message_latency > 0
    assert fit.message_latency == _bisect(whole, measured)
