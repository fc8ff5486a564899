"""Predicted peak memory per rank: the one place the search asks the memory model.

:func:`rank_memory` is :func:`pipeweave.planner.memory.predicted_memory`'s total per rank
(parameters, gradients, optimizer state, weight versions, held activations, buffers in
flight). Two lower bounds of it prune before it is asked: :func:`static_memory`, the part
that needs no schedule (parameters, gradients and optimizer state), before anything is
built; and :func:`memory_floor`, parameters and optimizer state plus the most activations
the rank's compute-only program holds at once (the schedule the simulator walks, cached
per shape, :mod:`pipeweave.auto.timing`; its held counts walked once per shape,
:func:`pipeweave.memory.held_counts.held_peak_bytes`): a walk of the program, where the memory model
first lowers it and proves every delivery (seconds at 1,000 ranks). It drops what the model
adds on top (gradients, weight copies, buffers, workspace, split backwards' pending bytes),
each at least zero, and the moment of the activations' peak is one of those the model
weighs, so the floor never exceeds the model's peak (``tests/auto/test_memory_floor.py``);
nor does the moment before a replicated stage's update, its gradients and their reduction's
buffers (``planner.memory.reduction_bytes``), which the floor takes when it is larger.
"""

from __future__ import annotations

from ..ir import Schedule
from collections.abc import Sequence

from ..memory import Sharding, StageWeights, model_state
from ..memory.held_counts import held_peak_bytes
from ..planner.memory import (analysis_cached, optimizer_state_bytes, plan_sharding,
                              predicted_memory, reduction_bytes, stage_activation_bytes,
                              stage_weights)
from ..collector import paused_collection
from ..planner.plan import Plan
from ..schedules import get_info
from ..schedules.flush_arrays import ArrayPrograms
from .copies import one_copy_plan
from .problem import AutoProblem

__all__ = ["rank_memory", "static_memory", "memory_floor", "reduction_floor", "ROUNDING",
           "memory_at_hand"]

ROUNDING = 1e-9
""":func:`memory_floor`'s activations are this fraction below the counted bytes: the model sums
the same bytes in another order (:mod:`pipeweave.memory.held_counts`)."""


def static_memory(problem: AutoProblem, plan: Plan) -> list[float]:
    """Per rank: the memory model's state (:func:`pipeweave.memory.model_state`) without the
    weight copies and the reference model (they need the schedule): ``N * (2 + k) * |w|`` of
    the stages it hosts (``k`` optimizer tensors per parameter), at most the model's
    prediction for every schedule."""
    # data-parallel copies host the same stages, so copy 0's numbers repeat for each copy
    copies = plan.width if _copies_alike(plan) else 1
    own = one_copy_plan(plan) if copies > 1 else plan
    layout = own.layout()
    profile = problem.profile
    states = model_state(stage_weights(profile, own),
                         optimizer_state_bytes(profile, own, problem.optimizer),
                         [layout.stages_of(r) for r in range(layout.num_ranks)],
                         pipelines=own.pipelines, reference=False,
                         sharding=plan_sharding(plan))
    return [s.total for s in states] * copies


def _copies_alike(plan: Plan) -> bool:
    """``plan``'s ranks are ``w`` copies of one pipeline (N = 1), copy ``k`` on ranks ``k·d ..``
    (every stage on ``w`` ranks, none replicated PipeDream's way)."""
    if plan.width == 1 or plan.replicas is not None or plan.pipelines != 1:
        return False
    depth = plan.world_size // plan.width
    return all(ranks == tuple(ranks[0] + k * depth for k in range(plan.width))
               for ranks in plan.layout().stage_ranks)


def rank_memory(problem: AutoProblem, plan: Plan, *, one_copy: bool = False) -> list[float]:
    """Predicted peak bytes of every rank (module docstring); ``one_copy``: the plan's
    data-parallel copies are identical (:mod:`pipeweave.auto.copies`), so copy 0 is asked
    and its ranks' numbers repeat for every copy."""
    with paused_collection():  # the walks allocate, nothing cyclic (pipeweave/collector.py)
        if one_copy:  # a sharded copy holds 1/w of each stage: told by its sharding
            ranks = predicted_memory(problem.profile, one_copy_plan(plan),
                                     batch_size=problem.batch // plan.width,
                                     optimizer=problem.optimizer, copies_of=plan.width,
                                     sharding=plan_sharding(plan))
            return [r.total for r in ranks] * plan.width
        ranks = predicted_memory(problem.profile, plan, batch_size=problem.batch,
                                 optimizer=problem.optimizer)
    return [r.total for r in ranks]


def memory_at_hand(plan: Plan, *, one_copy: bool = False) -> bool:
    """Whether :func:`rank_memory` of ``plan`` finds its shape's analysis cached (the plan it
    asks the model about: copy 0 with ``one_copy``)."""
    return analysis_cached(one_copy_plan(plan) if one_copy else plan)


def reduction_floor(weights: Sequence[StageWeights], hosted: Sequence[Sequence[int]],
                    ways: Sequence[int], sharding: Sharding) -> list[float]:
    """Per rank hosting ``hosted[r]``: what it holds besides parameters and optimizer state
    while a stage's gradients are reduced over its ``ways[s]`` ranks before the update (the
    gradients and the reduction's buffers, ``planner.memory.reduction_bytes``), whatever
    else it holds then."""
    return [max((weights[s].trainable + reduction_bytes(weights[s], ways[s], sharding)
                 for s in stages), default=0.0) for stages in hosted]


def memory_floor(problem: AutoProblem, plan: Plan, schedule: Schedule | ArrayPrograms, *,
                 one_copy: bool = False) -> list[float]:
    """Per rank of ``schedule`` (compute-only, one iteration of a synchronous ``plan``, or
    copy 0 of it with ``one_copy``; or its programs as columns,
    :mod:`~pipeweave.schedules.flush_arrays`, which count the same): a lower bound of
    :func:`rank_memory` (module docstring)."""
    if not get_info(plan.schedule).synchronous:
        raise ValueError(f"memory_floor covers synchronous schedules, not {plan.schedule!r}")
    own = one_copy_plan(plan) if one_copy else plan
    batch = problem.batch // plan.width if one_copy else problem.batch
    profile = problem.profile
    rows = batch // own.microbatches
    scale = 1.0 if profile.batch_size is None else rows / profile.batch_size
    # a forward keeps its graph unless its stage recomputes (synchronous: no predictions)
    kept = stage_activation_bytes(profile, own, scale)
    # counted once per shape, weighed per partition; the bytes summed in another order than
    # the model's running total, so a relative ROUNDING below it (still a floor)
    peaks = (schedule.held_peak_bytes(kept) if isinstance(schedule, ArrayPrograms)
             else held_peak_bytes(schedule, kept))
    held = [peak * (1.0 - ROUNDING) for peak in peaks]
    state = optimizer_state_bytes(profile, own, problem.optimizer)
    weights = stage_weights(profile, own)
    hosted = [schedule.layout.stages_of(r) for r in range(schedule.num_ranks)]
    sharding = plan_sharding(plan)
    states = model_state(weights, state, hosted, pipelines=own.pipelines, reference=False,
                         sharding=sharding)
    ways = [(plan.width if one_copy else 1) * len(r) for r in schedule.layout.stage_ranks]
    reducing = reduction_floor(weights, hosted, ways, sharding)
    # without the gradients, which the model counts at the peak's moment
    return [s.parameters + s.optimizer_state + max(peak, extra)
            for s, peak, extra in zip(states, held, reducing)]
