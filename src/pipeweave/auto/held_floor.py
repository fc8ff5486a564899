"""A memory floor from the schedule's shape alone: the micro-batches each stage surely holds.

:func:`~pipeweave.auto.memory.memory_floor` walks the schedule, so a candidate must be built
before it can be pruned on memory; at planning scale a 256-stage schedule of thousands of
micro-batches takes seconds to build, and most such candidates do not fit (a zero-bubble
schedule keeps ``P`` to ``2P - 1`` micro-batches on every stage, DeepSpeed's "a schedule's
memory cost is part of its interface"). Here each schedule family declares how many
micro-batches stage ``s`` of ``S`` holds at least at its peak, for ``M`` micro-batches per
copy (:data:`HELD_AT_LEAST`, read off the generators; ``tests/auto/test_held_floor.py``
checks every entry against the generated schedules on a grid of depths, chunks and
micro-batch counts, and that every registered synchronous schedule is listed or takes the
floor of one micro-batch)::

    1f1b, avgpipe, sliced-1f1b    min(M, P - s)       (the warm-up forwards before B(s, 0))
    gpipe, gpipe-grouped          M                   (every forward before any backward)
    zb-h1                         min(M, P)           (a W's activation waits for the W)
    zb-h2                         min(M, 2P - 1)
    interleaved-1f1b              min(M, P - s mod P)  (each chunk at least 1F1B's warm-up)
    interleaved-zb                min(M, P); 2P on the first chunk of two (its W's wait:
                                  the last stage keeps P micro-batches, not one)
    dualpipev                     min(M, S - s)
    v-half, zbv                   min(M, ceil((S - s) / 2))
    v-min                         min(M, ceil((S - s) / 3))
                                  (the last six: 1 on a single rank, P = 1)
    any other                     1                   (a forward's activation is held)

A rank holds at least the largest of its stages' ``a_s x count_s`` (``a_s`` the bytes a
micro-batch leaves on stage ``s``, :func:`~pipeweave.planner.memory.stage_activation_bytes`)
on top of its parameters and optimizer state (or, if more, a stage's gradients and their
reduction's buffers before its update, :func:`~pipeweave.auto.memory.reduction_floor`), so
:func:`held_floor` is at most
:func:`~pipeweave.auto.memory.memory_floor` (which takes the program's real peak of the
sum), hence at most the memory model: a candidate over the limit by it is pruned before its
schedule is built.
"""

from __future__ import annotations

from collections.abc import Callable

from ..memory import model_state
from ..planner.memory import (optimizer_state_bytes, plan_sharding, stage_activation_bytes,
                              stage_weights)
from ..planner.plan import Plan
from ..schedules import get_info
from .copies import one_copy_plan
from .memory import ROUNDING, reduction_floor
from .problem import AutoProblem

__all__ = ["HELD_AT_LEAST", "held_at_least", "held_floor"]

Count = Callable[[int, int, int, int], int]
"""``count(stage, stages, ranks, microbatches)``: micro-batches the stage holds at least."""


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


HELD_AT_LEAST: dict[str, Count] = {
    "1f1b": lambda s, S, P, M: min(M, P - s),
    "avgpipe": lambda s, S, P, M: min(M, P - s),
    "sliced-1f1b": lambda s, S, P, M: min(M, P - s),
    "gpipe": lambda s, S, P, M: M,
    "gpipe-grouped": lambda s, S, P, M: M,
    "zb-h1": lambda s, S, P, M: min(M, P),
    "zb-h2": lambda s, S, P, M: min(M, 2 * P - 1),
    "interleaved-1f1b": lambda s, S, P, M: min(M, P - s % P) if P > 1 else 1,
    "interleaved-zb": lambda s, S, P, M: min(M, 2 * P if S == 2 * P and s < P else P)
    if P > 1 else 1,
    "dualpipev": lambda s, S, P, M: min(M, S - s) if P > 1 else 1,
    "v-half": lambda s, S, P, M: min(M, _ceil(S - s, 2)) if P > 1 else 1,
    "zbv": lambda s, S, P, M: min(M, _ceil(S - s, 2)) if P > 1 else 1,
    "v-min": lambda s, S, P, M: min(M, _ceil(S - s, 3)) if P > 1 else 1,
}
"""Per schedule: the micro-batches stage ``s`` surely holds at its peak (module docstring)."""


def held_at_least(schedule: str, stage: int, stages: int, ranks: int, microbatches: int) -> int:
    """:data:`HELD_AT_LEAST` of ``schedule`` (1 for a schedule not listed)."""
    count = HELD_AT_LEAST.get(schedule)
    return 1 if count is None else max(1, count(stage, stages, ranks, microbatches))


def held_floor(problem: AutoProblem, plan: Plan) -> list[float]:
    """Per rank of copy 0 of a synchronous ``plan`` of one pipeline whose stages have one
    rank per copy: a lower bound of its memory model's peak, with no schedule built (module
    docstring); an empty list for any other plan (no floor)."""
    layout = plan.layout()
    if not get_info(plan.schedule).synchronous or plan.pipelines != 1 or any(
            len(ranks) != plan.width for ranks in layout.stage_ranks):
        return []
    own = one_copy_plan(plan)
    profile = problem.profile
    rows = problem.batch // plan.width // own.microbatches
    scale = 1.0 if profile.batch_size is None else rows / profile.batch_size
    kept = stage_activation_bytes(profile, own, scale)
    stages = len(own.stages)
    depth = stages // own.chunks
    own_layout = own.layout()
    weights = stage_weights(profile, own)
    hosted = [own_layout.stages_of(r) for r in range(own_layout.num_ranks)]
    sharding = plan_sharding(plan)
    states = model_state(weights, optimizer_state_bytes(profile, own, problem.optimizer),
                         hosted, pipelines=1, reference=False, sharding=sharding)
    reducing = reduction_floor(weights, hosted, [plan.width] * stages, sharding)
    floors = []
    for rank, state in enumerate(states):
        held = max((kept[s] * held_at_least(plan.schedule, s, stages, depth, own.microbatches)
                    for s in hosted[rank]), default=0.0)
        floors.append(state.parameters + state.optimizer_state
                      + max(held * (1.0 - ROUNDING), reducing[rank]))
    return floors
