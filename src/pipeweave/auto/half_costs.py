"""What a Slicer half costs a ``pipeweave auto`` candidate: its costs at half the
micro-batch size, by the planner's one rule (:func:`pipeweave.planner.slicer_halves.halves_at`,
whose docstring gives the formulas and why).

A sliced candidate's half costs are the same costs as its whole ones (:func:`~pipeweave.planner.
evaluate.plan_costs` with the runtime's per-action and per-message costs, recomputation, APC)
of the problem's profile scaled to ``ceil(m / 2)`` samples (:mod:`pipeweave.auto.scaling`,
from every profiled size), each at least half the whole's, which keeps
:mod:`pipeweave.auto.bounds` (a half at half the whole) a bound.
"""

from __future__ import annotations

from collections.abc import Callable

from ..planner.plan import Plan
from ..planner.slicer_halves import halves_at
from ..profiler import Profile
from ..schedules import get_info
from ..sim import Costs
from .problem import AutoProblem
from .scaling import scaled_profile

__all__ = ["slices", "half_size", "half_profile", "with_halves"]

_PROFILES: dict[tuple[int, int], tuple[Profile, Profile]] = {}
"""Half-size profiles by (id of the problem's profile, samples), with the profile they scale."""


def slices(plan: Plan) -> bool:
    """Whether ``plan``'s schedule forwards micro-batches in halves (the Slicer's own)."""
    return get_info(plan.schedule).sliced == plan.schedule


def half_size(problem: AutoProblem, plan: Plan) -> int:
    """Samples of a half micro-batch: the larger of the two pieces."""
    size = problem.batch // plan.microbatches
    return max(1, (size + 1) // 2)


def half_profile(problem: AutoProblem, samples: int) -> Profile:
    """The problem's profile at ``samples`` per micro-batch (cached per profile and size)."""
    key = (id(problem.profile), samples)
    hit = _PROFILES.get(key)
    if hit is not None and hit[0] is problem.profile:
        return hit[1]
    scaled = scaled_profile(problem.profile, samples, problem.extra_profiles)
    if len(_PROFILES) > 16:
        _PROFILES.clear()
    _PROFILES[key] = (problem.profile, scaled)
    return scaled


def with_halves(costs: Costs, plan: Plan, problem: AutoProblem,
                costs_at: Callable[[Profile], Costs]) -> Costs:
    """``costs`` of a sliced ``plan`` with its half costs (module docstring); ``costs_at``:
    the candidate's costs under another profile. Other plans: ``costs`` unchanged."""
    if not slices(plan):
        return costs
    return halves_at(costs, len(plan.stages), half_profile(problem, half_size(problem, plan)),
                     costs_at)
