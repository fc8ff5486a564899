"""Pieces shared by the generators: routing micro-batches to replicas and flush iterations."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..ir import Action, Layout, Op, Schedule
from .registry import Shape

__all__ = ["routed", "update_actions", "flush_schedule", "Order", "one_f_one_b_order", "Pass",
           "CopyOrder", "copies_schedule"]

Order = Callable[[int, int, Sequence[int]], list[tuple[Op, int]]]
"""``order(position, depth, microbatches)``: the F/B sequence of one stage of a flush schedule,
where ``position`` is the stage's index in its pipeline and ``depth`` the pipeline's length."""


def routed(layout: Layout, stage: int, rank: int, microbatches: Sequence[int]) -> list[int]:
    """The micro-batches of ``microbatches`` that ``layout`` routes to ``rank`` for ``stage``."""
    return [j for j in microbatches if layout.rank_of(stage, j) == rank]


def update_actions(layout: Layout, stage: int, version: int, pipeline: int = 0) -> list[Action]:
    """All-reduce among replicas (if any), then the optimizer step producing ``version``."""
    actions = []
    if layout.replicas(stage) > 1:
        actions.append(Action(Op.ALL_REDUCE, stage, version=version, pipeline=pipeline))
    actions.append(Action(Op.STEP, stage, version=version, pipeline=pipeline))
    return actions


def flush_schedule(name: str, shape: Shape, order: Order, *, first_iteration: int = 0,
                   **options: object) -> Schedule:
    """A synchronous schedule: each iteration runs ``order`` per stage, then updates every stage.

    Iteration ``k`` uses weight version ``k`` for every forward and backward, and ends with
    update ``k+1`` (after the all-reduce when a stage is replicated). ``first_iteration``
    lays out iterations ``first_iteration .. first_iteration + K - 1`` of a longer run, with
    that run's micro-batch numbers and versions (no iteration depends on an earlier one's
    actions, only on its updates).
    """
    layout = shape.layout()
    depth = layout.num_stages
    programs: list[list[Action]] = [[] for _ in range(layout.num_ranks)]
    for rank, program in enumerate(programs):
        for k in range(first_iteration, first_iteration + shape.iterations):
            batch = range(k * shape.microbatches, (k + 1) * shape.microbatches)
            for stage in layout.stages_of(rank):
                mbs = routed(layout, stage, rank, batch)
                for op, j in order(stage, depth, mbs):
                    program.append(Action(op, stage, j, version=k))
            for stage in layout.stages_of(rank):
                program.extend(update_actions(layout, stage, k + 1))
    return Schedule(
        name=name, layout=layout, microbatches=shape.microbatches, iterations=shape.iterations,
        programs=tuple(tuple(p) for p in programs), synchronous=True,
        options={**dict(shape.options), **options},
    )


def one_f_one_b_order(position: int, depth: int, microbatches: Sequence[int]) -> list[tuple[Op, int]]:
    """Warm-up of ``depth - position - 1`` forwards, alternate F/B, then drain the backwards.

    Stage ``position`` holds at most ``min(depth - position, M)`` activations at once.
    """
    n = len(microbatches)
    warmup = min(depth - position - 1, n)
    order = [(Op.FORWARD, microbatches[i]) for i in range(warmup)]
    for i in range(n - warmup):
        order.append((Op.FORWARD, microbatches[warmup + i]))
        order.append((Op.BACKWARD, microbatches[i]))
    order.extend((Op.BACKWARD, microbatches[i]) for i in range(n - warmup, n))
    return order


Pass = tuple[Op, int, int]
"""``(op, stage, i)``: a pass of the ``i``-th micro-batch (0-based, within one iteration and one
pipeline copy) on ``stage``."""

CopyOrder = Callable[[int, int], Sequence[Sequence[Pass]]]
"""``order(P, M)``: for each rank ``r = 0 .. P-1`` of one pipeline copy, its passes of one
iteration of ``M`` micro-batches, in program order. Zero-bubble orders are found for all of a
copy's ranks at once (a pass may wait for another rank's), hence one function for the copy."""


def copies_schedule(name: str, shape: Shape, layout: Layout, order: CopyOrder) -> Schedule:
    """A synchronous schedule on ``layout`` (``shape.width`` copies of ``P`` ranks): every
    iteration runs ``order`` on each copy's micro-batches, then updates each rank's stages.

    Iteration ``k`` uses weight version ``k`` and ends with update ``k+1`` (after the
    all-reduce among the copies when ``width > 1``), as :func:`flush_schedule`.
    """
    P, M = shape.stages, shape.microbatches
    orders: dict[int, Sequence[Sequence[Pass]]] = {}
    programs: list[list[Action]] = [[] for _ in range(layout.num_ranks)]
    for copy in range(shape.width):
        for k in range(shape.iterations):
            mbs = routed(layout, 0, copy * P, range(k * M, (k + 1) * M))
            if len(mbs) not in orders:
                orders[len(mbs)] = order(P, len(mbs))
            for r, passes in enumerate(orders[len(mbs)]):
                rank = copy * P + r
                programs[rank].extend(Action(op, stage, mbs[i], version=k) for op, stage, i in passes)
                for stage in layout.stages_of(rank):
                    programs[rank].extend(update_actions(layout, stage, k + 1))
    return Schedule(
        name=name, layout=layout, microbatches=M, iterations=shape.iterations,
        programs=tuple(tuple(p) for p in programs), synchronous=True, options=dict(shape.options),
    )
