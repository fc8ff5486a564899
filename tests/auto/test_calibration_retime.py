"""``auto --run`` re-times the calibration plans beside the winner and the default
(measure/calibration_retime.py): the runs are replaced by what the model predicts at known
parameters, first at one machine state (the calibration) and then at another (the rounds of
the measurement); the re-fit finds the second, the drift is the ratio of the two, and the
re-predictions are the plans simulated at the second, whatever the winner itself measured.
No process runs here."""

from __future__ import annotations

from dataclasses import replace

import pytest

from auto_fixtures import small_profile
from pipeweave.auto import AutoProblem
from pipeweave.auto.repredict import repredicted
from pipeweave.auto.search import default_prediction
from pipeweave.measure.alternating import Rounds, TimedRounds
from pipeweave.measure.calibration_retime import LABEL, Retiming, retimed_report
from pipeweave.measure.calibration_runs import calibration_plans, fit_calibration, with_fit
from pipeweave.planner.plan import Plan
from pipeweave.profiler import LinkProfile
from pipeweave.profiler.runtime_costs import RuntimeCosts

CALIBRATED = {"message_latency": 4e-4, "allreduce_latency": 2e-3, "compute_scale": 1.0}
LATER = {"message_latency": 9e-4, "allreduce_latency": 3e-3, "compute_scale": 1.25}


def _problem() -> AutoProblem:
    profile = replace(small_profile(5, blocks=8, link=LinkProfile(1e9, 1e-5)),
                      runtime=RuntimeCosts(per_message=2e-5, allreduce_bandwidth=3e8))
    return AutoProblem(profile=profile, ranks=2)


def _fitted(problem: AutoProblem) -> tuple[AutoProblem, Retiming]:
    plans = calibration_plans(problem, actions=False)

    def time_one(label: str, plan: Plan, steps: int) -> tuple[float, list[float]]:
        per_rank = plans[label].compute(CALIBRATED) / 2
        return plans[label].iteration(CALIBRATED), [per_rank] * 2

    fitted, fit = fit_calibration(problem, time_one=time_one, rounds=3, seconds=0.1,
                                  actions=False)
    assert fit is not None
    return fitted, Retiming(problem, fit, actions=False)


def _later_rounds(problem: AutoProblem) -> TimedRounds:
    plans = calibration_plans(problem, actions=False)
    labels = {LABEL.format(label): plan for label, plan in plans.items()}
    return TimedRounds({label: Rounds((plan.iteration(LATER),) * 3, 5)
                        for label, plan in labels.items()},
                       {label: [plan.compute(LATER)] * 3 for label, plan in labels.items()},
                       {label: 2 for label in labels})


def test_the_refit_finds_the_later_machine_and_the_drift_is_the_ratio() -> None:
    problem = _problem()
    fitted, retiming = _fitted(problem)
    plans = retiming.plans()
    assert set(retiming.beside()) == {"calibration default", "calibration data-parallel"}
    default = default_prediction(fitted)
    assert default is not None
    compared = {"default": {"iteration_time": 0.123}}  # what the default itself ran: unused
    report = retimed_report(retiming, _later_rounds(problem), {"default": default}, compared)
    for name, value in LATER.items():
        assert report["fitted"][name] == pytest.approx(value, rel=1e-6)
    for label, plan in plans.items():
        drift = report["plans"][label]["drift"]
        assert drift == pytest.approx(plan.iteration(LATER) / plan.iteration(CALIBRATED) - 1,
                                      rel=1e-9)
        assert drift > 0.05  # the later machine is slower: a drift the test can see
    # the default is the calibration's default plan: priced again at the later machine
    again = compared["default"]["retimed_prediction"]
    assert again == pytest.approx(plans["default"].iteration(LATER), rel=1e-6)
    assert again == pytest.approx(
        repredicted(default, with_fit(problem, LATER)).iteration_time, rel=1e-6)
    assert compared["default"]["retimed_error"] == pytest.approx(abs(again - 0.123) / 0.123)


def test_the_winners_own_time_does_not_enter_the_refit() -> None:
    problem = _problem()
    fitted, retiming = _fitted(problem)
    default = default_prediction(fitted)
    assert default is not None
    outcomes = []
    for ran in (0.01, 10.0):
        compared = {"winner": {"iteration_time": ran}}
        retimed_report(retiming, _later_rounds(problem), {"winner": default}, compared)
        outcomes.append(compared["winner"]["retimed_prediction"])
    assert outcomes[0] == outcomes[1]


def test_plans_other_than_the_fitted_ones_are_refused() -> None:
    problem = _problem()
    _, retiming = _fitted(problem)
    with pytest.raises(ValueError, match="are not the fitted ones"):
        replace(retiming, actions=True, problem=replace(
            problem, profile=replace(problem.profile, runtime=RuntimeCosts(
                per_message=2e-5, allreduce_bandwidth=None)))).plans()
