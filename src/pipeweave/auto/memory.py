"""Predicted peak memory per rank: the one place the search asks the memory model.

Until the memory model lands this is its simplest form: per rank, for every stage it holds,
parameters, their gradients, the optimizer state, one more copy of the parameters per extra
weight version the simulator counts, and the most activation bytes the simulator saw held at
once (``SimulationResult.peak_activation_bytes``, which already reflects recomputation through
the costs).
"""

from __future__ import annotations

from ..planner.plan import Plan
from ..sim import SimulationResult
from .problem import AutoProblem

__all__ = ["rank_memory", "static_memory"]


def static_memory(problem: AutoProblem, plan: Plan) -> list[float]:
    """Per rank, what does not depend on the schedule's timing (a lower bound of the peak):
    parameters, gradients and optimizer state of the stages it holds, one version each."""
    blocks = problem.profile.blocks
    layout = plan.layout()
    out = []
    for rank in range(layout.num_ranks):
        total = 0.0
        for s in layout.stages_of(rank):
            a, e = plan.stages[s]
            total += sum(2 * b.parameter_bytes + b.optimizer_bytes for b in blocks[a:e])
        out.append(total * plan.pipelines)
    return out


def rank_memory(problem: AutoProblem, plan: Plan, simulation: SimulationResult) -> list[float]:
    """Predicted peak bytes of every rank (module docstring)."""
    blocks = problem.profile.blocks
    layout = plan.layout()
    fixed = static_memory(problem, plan)
    out = []
    for rank in range(layout.num_ranks):
        versions = 0.0
        for s in layout.stages_of(rank):
            a, e = plan.stages[s]
            extra = max(simulation.weight_versions[s] - 1, 0)
            versions += extra * sum(b.parameter_bytes for b in blocks[a:e])
        out.append(fixed[rank] + versions * plan.pipelines
                   + simulation.peak_activation_bytes[rank])
    return out
