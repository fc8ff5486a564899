"""The search's timing-only simulation (sim.simulate_timing through auto/timing.py's schedule
cache) gives exactly the full simulator's iteration time, window and bubble, for every
registered schedule, with uneven costs, transfers, all-reduces and shared cores."""

from __future__ import annotations

import random

import pytest

from pipeweave.auto.timing import time_plan
from pipeweave.planner import Plan
from pipeweave.schedules import available_schedules, build_schedule
from pipeweave.sim import Costs, simulate, simulate_timing

NAMES = [info.name for info in available_schedules()]


def _costs(stages: int, seed: int, cores: int | None = None) -> Costs:
    rng = random.Random(seed)
    return Costs(forward=[rng.uniform(0.5, 2) for _ in range(stages)],
                 backward=[rng.uniform(1, 4) for _ in range(stages)],
                 weight_grad=[rng.uniform(0.2, 0.9) for _ in range(stages)],
                 comm=[rng.uniform(0, 0.5) for _ in range(stages - 1)], latency=0.01,
                 update=[rng.uniform(0, 1) for _ in range(stages)],
                 all_reduce=[rng.uniform(0, 2) for _ in range(stages)], shared_cores=cores)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("cores", [None, 3])
def test_timing_only_equals_the_full_simulation(name: str, cores: int | None) -> None:
    info = next(i for i in available_schedules() if i.name == name)
    chunks = info.default_chunks
    iterations = 1 if info.synchronous else 4
    checked = 0
    for depth, microbatches, width in ((2, 4, 1), (4, 8, 1), (2, 8, 2)):
        plan = Plan.uniform(depth * chunks * 2, depth, chunks=chunks, schedule=name,
                            microbatches=microbatches, width=width)
        try:
            schedule = build_schedule(name, plan.shape(iterations))
        except ValueError:
            continue  # the schedule does not take this shape
        for seed in range(3):
            costs = _costs(depth * chunks, seed, cores)
            full = simulate(schedule, costs)
            fast = simulate_timing(schedule, costs)
            assert (fast.iteration_time, fast.window, fast.bubble_fraction, fast.makespan) == (
                full.iteration_time, full.window, full.bubble_fraction, full.makespan), name
            # through the search's per-shape cache: a second costs table on the same schedule
            cached = time_plan(plan, costs, iterations, one_copy=False)
            assert cached == fast
            checked += 1
    assert checked >= 3, name
