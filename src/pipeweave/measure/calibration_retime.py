"""``pipeweave auto --run``: the calibration's plans timed again in the same alternating rounds
as the winner and the default, the runtime costs fitted again from those rounds, and the two
plans predicted again from that fit.

Why: on this 2-core machine one plan's iteration moves by 15-20 % between the calibration's
rounds and the measurement a minute later (2026-11-27, quiet, ``benchmarks/auto_predict.py``:
gpt-tiny's default at 4 ranks predicted 77.3 / 74.1 / 61.8 ms in three runs, which it ran
76.8 / 78.8 / 66.4 ms in the calibration's own rounds and 64.7 / 61.3 / 69.2 ms in the
measurement). So the error of a prediction against the measurement mixes what the model
misses with how much the machine changed in between. Timing the calibration plans beside the
winner and the default, and fitting the same parameters from those rounds
(:func:`~.calibration_runs.fit_measured`), tells them apart:

* **drift**, per calibration plan: its median in these rounds over its median in the
  calibration's, minus 1 (how much the machine changed);
* **the re-fit prediction** of the winner and the default
  (:func:`pipeweave.auto.repredict.repredicted`): the model's error with the machine as it was
  while they ran. No run of the winner or the default enters that fit; where the default is
  itself the calibration's ``default`` plan, it is priced from its own rounds, as it was by
  the first fit.

The search is not repeated: the winner is the one chosen from the first fit's predictions,
and the first prediction's error stays the one reported as the error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..auto import AutoProblem, Prediction
from ..auto.repredict import repredicted
from ..planner.plan import Plan
from .calibration_runs import CalibrationFit, CalibrationPlan, calibration_plans, fit_measured
from .alternating import TimedRounds

__all__ = ["LABEL", "Retiming", "retimed_report"]

LABEL = "calibration {}"
"""How a re-timed calibration plan is labelled beside the winner and the default."""


@dataclass(frozen=True)
class Retiming:
    """What re-timing needs: the problem before any fit, the first fit, and whether that fit
    had the smallest-micro-batch plan (``actions``, :func:`~.calibration_runs.calibration_plans`)."""

    problem: AutoProblem
    fit: CalibrationFit
    actions: bool = True

    def plans(self) -> dict[str, CalibrationPlan]:
        """The calibration plans, as the first fit built them (same problem, same plans)."""
        plans = calibration_plans(self.problem, actions=self.actions)
        if set(plans) != set(self.fit.measured):
            raise ValueError(f"the calibration plans {sorted(plans)} are not the fitted ones "
                             f"{sorted(self.fit.measured)}: re-time with the problem and "
                             "options the calibration had")
        return plans

    def beside(self) -> dict[str, tuple[Plan, float]]:
        """Each calibration plan, labelled, with its calibration median (for its steps)."""
        return {LABEL.format(label): (plan.plan, self.fit.measured[label].median)
                for label, plan in self.plans().items()}


def retimed_report(retiming: Retiming, timed: TimedRounds,
                   predictions: Mapping[str, Prediction],
                   compared: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The drift and the re-fit (module docstring) from the calibration plans' ``timed``
    rounds; adds ``retimed_prediction`` and ``retimed_error`` to each label of ``compared``
    (:func:`~.compare.compare_predictions` of ``predictions``)."""
    plans = retiming.plans()
    rounds = {label: timed.rounds[LABEL.format(label)] for label in plans}
    compute = {label: timed.compute[LABEL.format(label)] for label in plans}
    problem, fit = fit_measured(retiming.problem, plans, rounds, compute)
    for label, prediction in predictions.items():
        again = repredicted(prediction, problem).iteration_time
        measured = compared[label]["iteration_time"]
        compared[label]["retimed_prediction"] = again
        compared[label]["retimed_error"] = abs(again - measured) / measured
    first = retiming.fit.measured
    return {"plans": {label: {**rounds[label].to_json(),
                              "calibration_median": first[label].median,
                              "drift": rounds[label].median / first[label].median - 1.0}
                      for label in plans},
            "fitted": dict(fit.fitted)}
