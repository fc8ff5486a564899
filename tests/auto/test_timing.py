"""The search's timing-only simulation (sim.simulate_timing through auto/timing.py's schedule
cache) gives exactly the full simulator's iteration time, window and bubble, for every
registered schedule, with uneven costs, transfers, all-reduces and shared cores."""

from __future__ import annotations

import pytest

from pipeweave.auto.timing import time_plan
from pipeweave.schedules import available_schedules
from pipeweave.sim import simulate, simulate_timing

from schedule_grid import random_costs, schedules_on_grid

NAMES = [info.name for info in available_schedules()]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("cores", [None, 3])
def test_timing_only_equals_the_full_simulation(name: str, cores: int | None) -> None:
    checked = 0
    for plan, iterations, schedule in schedules_on_grid(name, ((2, 4, 1), (4, 8, 1), (2, 8, 2)),
                                                        async_iterations=4):
        for seed in range(3):
            costs = random_costs(schedule.num_stages, seed, cores=cores)
            full = simulate(schedule, costs)
            fast = simulate_timing(schedule, costs)
            assert (fast.iteration_time, fast.window, fast.bubble_fraction, fast.makespan) == (
                full.iteration_time, full.window, full.bubble_fraction, full.makespan), name
            # through the search's per-shape cache: a second costs table on the same schedule
            cached = time_plan(plan, costs, iterations, one_copy=False)
            assert cached == fast
            checked += 1
    assert checked >= 3, name
