"""Every registered generator over a grid of shapes, edge sizes included.

For each (P, M, K) the generator accepts: the validator passes, every (stage, micro-batch,
pipeline) has exactly one forward and one backward per iteration (a sliced forward counts as
its two halves, a split backward as its I and W), the layout is the one the registry names
(:meth:`ScheduleInfo.layout`), lowering gives a valid schedule, and the simulator runs the lowered schedule
to the end (deadlock-free) with the same iteration time as the compute-only one. Shapes a
generator refuses must be refused with a message that names the fix.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from pipeweave.ir import GRADIENT_OPS, Op, lower, validate
from pipeweave.schedules import Shape, available_schedules, build_schedule, get_info
from pipeweave.sim import Costs, simulate

CHUNKS = {"interleaved-1f1b": 2, "wpipe": 2, "gpipe-grouped": 2, "zbv": 2, "v-half": 2, "v-min": 2,
          "interleaved-zb": 2}
PIPELINES = {"avgpipe": 2}
STAGES = (1, 2, 3, 4, 5)
MICROBATCHES = (1, 2, 3, 4, 5, 8)
ITERATIONS = (1, 2)
NAMES = [info.name for info in available_schedules()]


def shapes(name: str) -> list[tuple[int, int, int]]:
    info = get_info(name)
    return [(p, m, k) for p, m, k in itertools.product(STAGES, MICROBATCHES, ITERATIONS)
            if not (info.synchronous and k == 2 and m > 4)]  # keep the grid quick


def shape(name: str, p: int, m: int, k: int) -> Shape:
    return Shape(stages=p, microbatches=m, iterations=k, chunks=CHUNKS.get(name, 1),
                 pipelines=PIPELINES.get(name, 1))


def build(name: str, p: int, m: int, k: int):  # type: ignore[no-untyped-def]
    return build_schedule(name, shape(name, p, m, k))


def test_every_builtin_schedule_is_registered() -> None:
    assert set(NAMES) >= {"gpipe", "1f1b", "interleaved-1f1b", "pipedream", "2bw", "pipeoptim",
                          "spectrain", "wpipe", "avgpipe", "sliced-1f1b", "zb-h1", "zb-h2",
                          "zbv", "v-half", "v-min", "interleaved-zb", "gpipe-grouped"}


@pytest.mark.parametrize("name", NAMES)
def test_grid_is_valid_complete_and_deadlock_free(name: str) -> None:
    built = refused = 0
    for p, m, k in shapes(name):
        try:
            schedule = build(name, p, m, k)
        except ValueError as error:
            # The only reason to refuse a positive shape: too few micro-batches for the stages.
            assert "microbatches" in str(error) and ("raise" in str(error) or "multiple" in str(error)), (
                name, p, m, k, str(error))
            refused += 1
            continue
        built += 1
        validate(schedule)
        assert schedule.layout == get_info(name).layout(shape(name, p, m, k)), (name, p, m, k)
        stages = schedule.num_stages
        pipelines = PIPELINES.get(name, 1)
        halves: Counter[tuple[Op, int, int, int]] = Counter()
        for _, _, action in schedule.actions():
            if action.op in (Op.FORWARD, Op.BACKWARD):
                halves[(action.op, action.stage, action.microbatch, action.pipeline)] += (
                    1 if action.piece else 2)
            elif action.op in (Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT):  # half a backward each
                halves[(Op.BACKWARD, action.stage, action.microbatch, action.pipeline)] += 1
        expected = {(op, s, j, n) for op in (Op.FORWARD, Op.BACKWARD) for s in range(stages)
                    for j in range(m * k) for n in range(pipelines)}
        assert set(halves) == expected, (name, p, m, k)
        assert set(halves.values()) == {2}, (name, p, m, k)
        lowered = lower(schedule)
        validate(lowered)
        costs = Costs.uniform(1.0, 2.0, 0.25)
        timed = simulate(lowered, costs)  # runs to the end: deadlock-free
        # (lowering merges an I directly followed by its W into B, which costs I + W)
        assert timed.iteration_time == pytest.approx(simulate(schedule, costs).iteration_time)
    assert built >= 15, f"{name}: only {built} shapes built, {refused} refused"


@pytest.mark.parametrize("name", NAMES)
def test_no_message_waits_behind_an_update_that_does_not_produce_it(name: str) -> None:
    """Lowering puts every send right after the forward or backward that produces it, and
    every receive before the compute that needs it, never behind an update: a rank's update
    (per micro-batch under PipeDream/PipeOptim) cannot delay its neighbours' messages."""
    checked = 0
    for p, m, k in shapes(name):
        if p < 2:
            continue
        try:
            schedule = lower(build(name, p, m, k))
        except ValueError:
            continue
        for program in schedule.programs:
            for position, action in enumerate(program):
                if action.op in (Op.SEND_ACT, Op.SEND_GRAD):
                    producers = {Op.FORWARD} if action.op is Op.SEND_ACT else GRADIENT_OPS
                    between = program[:position][::-1]
                    steps = []
                    for earlier in between:
                        if (earlier.op in producers and earlier.stage == action.stage
                                and earlier.microbatch == action.microbatch
                                and earlier.pipeline == action.pipeline):
                            break
                        steps.append(earlier)
                    assert not [a for a in steps if a.op is Op.STEP], (name, p, m, k, action)
                    checked += 1
    assert checked > 0
