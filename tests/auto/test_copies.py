"""auto/copies.py: copy 0's programs are the one-copy schedule's with an ``AR`` right before
every ``U`` and nothing else changed (the slice-wise splice against an action-wise one)."""

from __future__ import annotations

import pytest

from pipeweave.auto.copies import one_copy_schedule
from pipeweave.ir import Action, Op
from pipeweave.planner import Plan
from pipeweave.schedules import build_schedule


def _action_wise(programs):  # type: ignore[no-untyped-def]
    out = []
    for program in programs:
        row = []
        for action in program:
            if action.op is Op.STEP:
                row.append(Action(Op.ALL_REDUCE, action.stage, version=action.version,
                                  pipeline=action.pipeline))
            row.append(action)
        out.append(tuple(row))
    return tuple(out)


@pytest.mark.parametrize("schedule,chunks,pipelines,iterations", [
    ("1f1b", 1, 1, 1), ("zb-h2", 1, 1, 1), ("interleaved-1f1b", 2, 1, 1), ("zbv", 2, 1, 1),
    ("gpipe", 1, 1, 2), ("avgpipe", 1, 2, 2)])
def test_one_copy_has_an_all_reduce_before_every_update(schedule: str, chunks: int,
                                                        pipelines: int, iterations: int) -> None:
    plan = Plan.uniform(32, 4, chunks=chunks, schedule=schedule, microbatches=16, width=2,
                        pipelines=pipelines)
    single = build_schedule(schedule, plan.shape(iterations).__class__(
        **{**plan.shape(iterations).__dict__, "width": 1, "microbatches": 8}))
    copy = one_copy_schedule(plan, iterations)
    assert copy.programs == _action_wise(single.programs)
    assert sum(a.op is Op.ALL_REDUCE for p in copy.programs for a in p) == \
        sum(a.op is Op.STEP for p in copy.programs for a in p) > 0
