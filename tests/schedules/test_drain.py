"""The asynchronous schedules' drain option: the literal schedule, fresh versions after each
drain, and the cost the simulator gives, (P - 1)(t_F + t_B) per drain (docs/semantics.md)."""

from __future__ import annotations

import pytest

from pipeweave.ir import Op, lower, validate
from pipeweave.schedules import build_schedule
from pipeweave.sim.costs import Costs
from pipeweave.sim.simulator import simulate

ASYNC = ["pipedream", "2bw", "pipeoptim", "spectrain", "wpipe"]


def rows(schedule) -> list[list[str]]:  # type: ignore[no-untyped-def]
    return [[str(a) for a in program] for program in schedule.programs]


def test_pipedream_drained_every_iteration_is_written_out() -> None:
    schedule = build_schedule("pipedream", stages=2, microbatches=2, iterations=2,
                              options={"drain": 1})
    assert rows(schedule) == [
        "0F0@0 0F1@0 0B0@0 0U@1 0B1@0 0U@2 0F2@2 0F3@2 0B2@2 0U@3 0B3@2 0U@4".split(),
        "1F0@0 1B0@0 1U@1 1F1@1 1B1@1 1U@2 1F2@2 1B2@2 1U@3 1F3@3 1B3@3 1U@4".split(),
    ]


@pytest.mark.parametrize("name", ASYNC)
@pytest.mark.parametrize("stages", [2, 3, 4])
def test_each_drained_segment_starts_on_the_newest_weights(name: str, stages: int) -> None:
    m, k, every = 2 * stages, 5, 2
    chunks = 2 if name == "wpipe" else 1
    schedule = build_schedule(name, stages=stages, microbatches=m, iterations=k, chunks=chunks,
                              options={"drain": every})
    validate(schedule)
    for program in schedule.programs:
        updates: dict[int, int] = {}
        for position, action in enumerate(program):
            if action.op is Op.STEP:
                updates[action.stage] = updates.get(action.stage, 0) + 1
            elif action.op is Op.FORWARD and action.microbatch % (every * m) == 0:
                # the first micro-batch after a drain: on the newest weights, and every earlier
                # micro-batch is done on this rank (nothing of the segment ran before)
                assert action.version == updates.get(action.stage, 0), (name, str(action))
                done = {a.microbatch for a in program[:position] if a.op is Op.BACKWARD}
                assert done == set(range(action.microbatch)) & {
                    a.microbatch for a in program if a.op is Op.BACKWARD}, (name, str(action))


@pytest.mark.parametrize("name", ASYNC)
@pytest.mark.parametrize(("stages", "microbatches"), [(2, 4), (3, 6), (4, 4), (4, 8)])
@pytest.mark.parametrize(("forward", "backward"), [(1.0, 2.0), (1.0, 1.0)])
def test_a_drain_costs_one_fill_and_drain(name: str, stages: int, microbatches: int,
                                          forward: float, backward: float) -> None:
    chunks = 2 if name == "wpipe" else 1
    costs = Costs(forward=forward, backward=backward)

    def makespan(options: dict) -> float:
        return simulate(lower(build_schedule(name, stages=stages, microbatches=microbatches,
                                             iterations=12, chunks=chunks, options=options)),
                        costs).makespan

    # drain=3 over 12 iterations: 3 drains more than the run's own end
    extra = makespan({"drain": 3}) - makespan({})
    assert extra == pytest.approx(3 * (stages - 1) * (forward + backward))


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "2"])
def test_a_drain_that_is_no_iteration_count_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match="option drain must be an integer >= 1"):
        build_schedule("pipedream", stages=2, microbatches=2, iterations=2,
                       options={"drain": value})


@pytest.mark.parametrize("name", ["pipedream", "2bw", "pipeoptim"])
def test_replicated_stages_drain_too(name: str) -> None:
    schedule = build_schedule(name, stages=2, microbatches=4, iterations=4, replicas=(2, 1),
                              options={"drain": 2})
    validate(schedule)
    for program in schedule.programs:
        first = next(a for a in program if a.op is Op.FORWARD and a.microbatch >= 8)
        steps = sum(1 for a in program[:program.index(first)] if a.op is Op.STEP)
        assert first.version == steps
