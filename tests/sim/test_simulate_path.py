"""``simulate_path`` (AutoPipe's simulation: iteration time and master stage alone) gives
exactly :func:`simulate`'s numbers, for every registered schedule, with uneven costs,
transfers, all-reduces and shared cores, with and without a reused action index."""

from __future__ import annotations

import random

import pytest

from pipeweave.ir.walk import index_actions
from pipeweave.planner import Plan
from pipeweave.schedules import available_schedules, build_schedule
from pipeweave.sim import Costs, simulate, simulate_path

NAMES = [info.name for info in available_schedules()]


def _costs(stages: int, seed: int, cores: int | None) -> Costs:
    rng = random.Random(seed)
    return Costs(forward=[rng.uniform(0.5, 2) for _ in range(stages)],
                 backward=[rng.uniform(1, 4) for _ in range(stages)],
                 weight_grad=[rng.uniform(0.2, 0.9) for _ in range(stages)],
                 comm=[rng.uniform(0, 0.5) for _ in range(stages - 1)], latency=0.01,
                 update=[rng.uniform(0, 1) for _ in range(stages)],
                 all_reduce=[rng.uniform(0, 2) for _ in range(stages)], shared_cores=cores)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("cores", [None, 3])
def test_path_equals_the_full_simulation(name: str, cores: int | None) -> None:
    info = next(i for i in available_schedules() if i.name == name)
    chunks = info.default_chunks
    iterations = 1 if info.synchronous else 4
    checked = 0
    for depth, microbatches in ((2, 4), (4, 8)):
        plan = Plan.uniform(depth * chunks * 2, depth, chunks=chunks, schedule=name,
                            microbatches=microbatches)
        try:
            schedule = build_schedule(name, plan.shape(iterations))
        except ValueError:
            continue  # the schedule does not take this shape
        index = index_actions(schedule)
        for seed in range(3):
            costs = _costs(depth * chunks, seed, cores)
            full = simulate(schedule, costs)
            for given in (None, index):
                path = simulate_path(schedule, costs, index=given)
                assert (path.iteration_time, path.master_stage) == (
                    full.iteration_time, full.master_stage), name
            checked += 1
    assert checked >= 2, name
