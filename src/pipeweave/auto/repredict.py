"""A prediction's plan priced again: under another problem (other runtime costs, e.g. fitted
again from later runs) with the profile the search gave it.

The search prices a candidate with the profile at its micro-batch size
(:func:`~pipeweave.auto.scaling.scaled_profile`, ``search._Search.profile``) and, for a
tensor-parallel size other than the profile's, that size's problem
(:func:`~pipeweave.auto.tensor_parallel.tp_problem`). :func:`priced_as_searched` is that
choice, used by ``--why``'s breakdown (:mod:`.why`) and by ``auto --run``'s re-prediction
(:mod:`pipeweave.measure.calibration_retime`); :func:`repredicted` simulates the candidate
again under it.
"""

from __future__ import annotations

from ..profiler import Profile
from .predict import Prediction, Timed, simulate_candidate
from .problem import AutoProblem
from .scaling import scaled_profile
from .tensor_parallel import tp_problem

__all__ = ["priced_as_searched", "repredicted"]


def priced_as_searched(prediction: Prediction,
                       problem: AutoProblem) -> tuple[AutoProblem, Profile]:
    """The problem and profile ``prediction``'s plan is priced with (module docstring)."""
    plan = prediction.plan
    if plan.tp != problem.profile.metadata.get("tp", 1):  # its own size's problem
        problem = tp_problem(problem, plan.tp)
    return problem, scaled_profile(problem.profile, problem.batch // plan.microbatches,
                                   problem.extra_profiles)


def repredicted(prediction: Prediction, problem: AutoProblem) -> Timed:
    """``prediction``'s candidate simulated again under ``problem``."""
    problem, profile = priced_as_searched(prediction, problem)
    return simulate_candidate(prediction.candidate, profile, problem)
