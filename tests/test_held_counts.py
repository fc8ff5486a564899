"""memory/held_counts.py: the held activations counted once per schedule and weighed per
partition give held_activations' peak bytes (to rounding) for every registered schedule,
with Slicer halves, split backwards, chunks, replicas and uneven sizes."""

from __future__ import annotations

import random

import pytest

from pipeweave.memory import held_activations
from pipeweave.memory.held_counts import held_peak_bytes
from pipeweave.schedules import available_schedules

from schedule_grid import schedules_on_grid

NAMES = [info.name for info in available_schedules()]


@pytest.mark.parametrize("name", NAMES)
def test_counted_once_weighed_like_the_walk(name: str) -> None:
    checked = 0
    for _, _, schedule in schedules_on_grid(name, ((2, 4, 1), (4, 8, 1), (4, 8, 2)),
                                            async_iterations=3):
        for seed in range(3):  # the same schedule, other sizes: the cached counts reused
            rng = random.Random(seed)
            sizes = [rng.uniform(1e6, 5e8) for _ in range(schedule.num_stages)]
            expected = held_activations(schedule, sizes)[1]
            got = held_peak_bytes(schedule, sizes)
            assert got == pytest.approx(expected, rel=1e-12), name
            checked += 1
    assert checked >= 3, name
