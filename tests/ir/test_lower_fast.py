"""``ir.lower.lower`` (one pass over tuples) gives, action for action, what the plain
lowering it replaced gave (kept here as the reference), on every registered schedule and
many shapes: widths, replicas' round robin, parallel pipelines, several iterations."""

from __future__ import annotations

from collections import defaultdict

import pytest

from pipeweave.ir import Action, Schedule, dependencies, ref
from pipeweave.ir.actions import Op
from pipeweave.ir.deps import producer_rank
from pipeweave.ir.lower import lower, merge_backward
from pipeweave.schedules import Shape, available_schedules, build_schedule

NAMES = [info.name for info in available_schedules()]
_SEND_FOR = {Op.FORWARD: Op.SEND_ACT, Op.BACKWARD: Op.SEND_GRAD, Op.BACKWARD_INPUT: Op.SEND_GRAD}
_RECV_FOR = {Op.FORWARD: Op.RECV_ACT, Op.BACKWARD: Op.RECV_GRAD}


def _reference(schedule: Schedule) -> Schedule:
    """The lowering as it was written first (per action, through the named fields)."""
    layout = schedule.layout
    needs_send: set[Action] = set()
    receives_before: dict[Action, list[Action]] = defaultdict(list)
    for rank, _, action in schedule.actions():
        if not action.is_compute:
            continue
        for dep in dependencies(action, layout, lowered=False):
            if dep.op not in _SEND_FOR or producer_rank(dep, layout) == rank:
                continue
            needs_send.add(dep)
            recv = dependencies(action, layout, lowered=True)
            receives_before[ref(action)].extend(d for d in recv if d.op is _RECV_FOR[dep.op])
    programs = []
    for program in schedule.programs:
        lowered: list[Action] = []
        for action in program:
            key = ref(action)
            lowered.extend(receives_before.get(key, ()))
            lowered.append(action)
            if key in needs_send:
                lowered.append(Action(_SEND_FOR[action.op], action.stage, action.microbatch,
                                      action.piece, pipeline=action.pipeline))
        programs.append(merge_backward(lowered))
    return schedule.with_programs(programs, lowered=True)


@pytest.mark.parametrize("name", NAMES)
def test_fast_lowering_equals_the_reference(name: str) -> None:
    info = next(i for i in available_schedules() if i.name == name)
    tried = 0
    for stages, microbatches, width, pipelines, iterations in (
            (2, 4, 1, 1, 1), (3, 6, 1, 1, 2), (4, 8, 1, 1, 1), (2, 4, 2, 1, 1), (4, 5, 1, 1, 1),
            (2, 4, 1, 2, 1), (4, 8, 2, 1, 2)):
        try:
            schedule = build_schedule(name, Shape(
                stages=stages, microbatches=microbatches, chunks=info.default_chunks,
                width=width, pipelines=pipelines, iterations=iterations))
        except ValueError:
            continue
        if schedule.lowered:
            schedule = schedule.compute_only()
            schedule = schedule.with_programs(schedule.programs, lowered=False)
        fast, slow = lower(schedule), _reference(schedule)
        assert fast.programs == slow.programs, (name, stages, microbatches, width)
        assert any(a.is_comm for p in fast.programs for a in p), name
        tried += 1
    assert tried >= 2, name
