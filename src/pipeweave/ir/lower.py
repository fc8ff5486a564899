"""Lowering: insert point-to-point sends and receives into a compute-only schedule.

For every cross-rank edge that :func:`pipeweave.ir.deps.dependencies` reports, the producer's
rank gets a send right after the producing action and the consumer's rank a receive right
before the consuming action. Sends are asynchronous (the runtime posts ``isend`` and moves
on); a receive blocks its rank until the data is there (the runtime may post the ``irecv``
earlier, which only helps). Example, 1F1B with P=2, M=2::

    rank0  0F0 0SF0 0F1 0SF1 0RB0 0B0 0RB1 0B1
    rank1  1RF0 1F0 1B0 1SB0 1RF1 1F1 1B1 1SB1

A split backward whose input gradient goes to another rank keeps its two halves, so the
gradient is sent before the weight gradient is computed (``1I0 1SB0 1W0``). Where nothing is
sent between them — the first stage, or a consumer on the same rank — an ``I`` immediately
followed by its ``W`` is merged into one ``B`` (:func:`merge_backward`): the same work in one
backward pass, so a schedule pays for the split only where the split helps.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from .actions import COMPUTE_OPS, Action, Op
from .deps import dependencies, producer_rank, ref
from .schedule import Schedule

__all__ = ["lower", "merge_backward"]

_SEND_FOR = {Op.FORWARD: Op.SEND_ACT, Op.BACKWARD: Op.SEND_GRAD, Op.BACKWARD_INPUT: Op.SEND_GRAD}
_RECV_FOR = {Op.FORWARD: Op.RECV_ACT, Op.BACKWARD: Op.RECV_GRAD}


def lower(schedule: Schedule) -> Schedule:
    """Return ``schedule`` with sends/receives inserted (idempotent)."""
    if schedule.lowered:
        return schedule
    layout = schedule.layout
    needs_send: set[Action] = set()
    receives_before: dict[Action, list[Action]] = defaultdict(list)
    # one pass per program over tuples: the memory model lowers every shape it analyses
    for rank, program in enumerate(schedule.programs):
        for action in program:
            if action[0] not in COMPUTE_OPS:
                continue
            for dep in dependencies(action, layout, lowered=False):
                dep_op = dep[0]
                if dep_op not in _SEND_FOR or producer_rank(dep, layout) == rank:
                    continue
                needs_send.add(dep)
                wanted = _RECV_FOR[dep_op]
                recv = dependencies(action, layout, lowered=True)
                receives_before[ref(action)].extend(d for d in recv if d[0] is wanted)
    programs = [merge_backward(_with_messages(p, needs_send, receives_before))
                for p in schedule.programs]
    return schedule.with_programs(programs, lowered=True)


def _with_messages(program: Sequence[Action], needs_send: set[Action],
                   receives_before: dict[Action, list[Action]]) -> list[Action]:
    """``program`` with its receives before and its sends after the compute they serve."""
    lowered: list[Action] = []
    for action in program:
        key = ref(action)
        before = receives_before.get(key)
        if before:
            lowered.extend(before)
        lowered.append(action)
        if key in needs_send:
            lowered.append(_new(Action, (_SEND_FOR[action[0]], action[1], action[2], action[3],
                                         None, 0, action[6])))
    return lowered


_new = tuple.__new__


def merge_backward(program: list[Action]) -> list[Action]:
    """``program`` with every ``I`` immediately followed by its own ``W`` merged into ``B``
    (the ``I``'s version and look-ahead, which the validator makes the ``W``'s too)."""
    merged: list[Action] = []
    skip = False
    for position, action in enumerate(program):
        if skip:
            skip = False
            continue
        after = program[position + 1] if position + 1 < len(program) else None
        if (action.op is Op.BACKWARD_INPUT and after is not None
                and after.op is Op.BACKWARD_WEIGHT and after.stage == action.stage
                and after.microbatch == action.microbatch and after.piece == action.piece
                and after.pipeline == action.pipeline):
            merged.append(action._replace(op=Op.BACKWARD))
            skip = True
        else:
            merged.append(action)
    return merged
