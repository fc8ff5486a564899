"""A memory floor that needs neither a partition nor a schedule: the model state spread evenly.

:func:`~pipeweave.auto.memory.static_memory` prunes a candidate once its partition method has
run; a method can cost seconds at planning scale (AutoPipe simulates the 1F1B of each split
it tries, PipeDream runs its dynamic program), so a shape whose model state cannot fit on any
split is pruned here first, for every method and recomputation of it at once.

One copy of the pipeline spreads the model's ``S = d x chunks`` stages over its ``d`` ranks
(PipeDream's replicated stages over ``d`` ranks too, with ``w = 1``: replicas only add
bytes). Rank ``r`` holds, in each of ``N`` pipelines, its stages' parameters ``|w_s|``, as
many gradient bytes and their optimizer state ``k_s``
(:func:`pipeweave.memory.model_state`, which :func:`~pipeweave.auto.memory.static_memory`
takes whole). Every stage is on some rank and the maximum is at least the mean, so::

    max over r of static(r)  >=  (1 / d) sum over r of static(r)
                             >=  N (2 |W| + K) / d

with ``|W|`` the model's parameter bytes, each tie once (``stage_parameter_bytes(0, n)``: a
split counts a tie at least once, in the stage holding it) and ``K`` the blocks' optimizer
state summed; a profile with ties counts no optimizer state here, since a stage holding both
ends of a tie holds its state once (``planner.memory._held_share``) and this floor stays
below every split. A candidate with ``N (2 |W| + K) / d`` over the memory limit has every
split over it, so it is pruned before its method runs.
"""

from __future__ import annotations

from ..planner.memory import optimizer_state_bytes
from ..planner.plan import Plan
from .problem import AutoProblem, Candidate

__all__ = ["StateFloor"]


class StateFloor:
    """:func:`static_memory`'s floor over every split (module docstring), per problem."""

    def __init__(self, problem: AutoProblem) -> None:
        profile = problem.profile
        weights = profile.stage_parameter_bytes(0, profile.num_blocks)
        whole = Plan(num_blocks=profile.num_blocks, stages=((0, profile.num_blocks),),
                     microbatches=1)
        state = 0.0 if profile.ties else sum(
            optimizer_state_bytes(profile, whole, problem.optimizer))
        self.per_copy = 2.0 * weights + state
        """``2 |W| + K``: a pipeline copy's model state, summed over its ranks."""

    def __call__(self, candidate: Candidate) -> float:
        """Bytes some rank of ``candidate`` holds at least, on every split."""
        return candidate.pipelines * self.per_copy / candidate.depth
