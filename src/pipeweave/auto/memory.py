"""Predicted peak memory per rank: the one place the search asks the memory model.

:func:`rank_memory` is :func:`pipeweave.planner.memory.predicted_memory`'s total per rank
(parameters, gradients, optimizer state, weight versions, held activations, buffers in
flight). :func:`static_memory` is the part that needs no schedule (parameters, gradients and
optimizer state), a lower bound of it that prunes before anything is built.
"""

from __future__ import annotations

from ..planner.memory import OPTIMIZER_STATE, predicted_memory
from ..planner.plan import Plan
from .copies import one_copy_plan
from .problem import AutoProblem

__all__ = ["rank_memory", "static_memory"]


def static_memory(problem: AutoProblem, plan: Plan) -> list[float]:
    """Per rank: ``N * (2 + k) * |w|`` of the stages it hosts (``k`` optimizer tensors per
    parameter), at most the model's prediction for every schedule."""
    layout = plan.layout()
    factor = plan.pipelines * (2 + OPTIMIZER_STATE[problem.optimizer])
    out = [0.0] * layout.num_ranks
    for (a, e), ranks in zip(plan.stages, layout.stage_ranks):
        weights = problem.profile.stage_parameter_bytes(a, e)
        for r in ranks:
            out[r] += factor * weights
    return out


def rank_memory(problem: AutoProblem, plan: Plan, *, one_copy: bool = False) -> list[float]:
    """Predicted peak bytes of every rank (module docstring); ``one_copy``: the plan's
    data-parallel copies are identical (:mod:`pipeweave.auto.copies`), so copy 0 is asked
    and its ranks' numbers repeat for every copy."""
    if one_copy:
        ranks = predicted_memory(problem.profile, one_copy_plan(plan),
                                 batch_size=problem.batch // plan.width,
                                 optimizer=problem.optimizer)
        return [r.total for r in ranks] * plan.width
    ranks = predicted_memory(problem.profile, plan, batch_size=problem.batch,
                             optimizer=problem.optimizer)
    return [r.total for r in ranks]
