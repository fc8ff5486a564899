"""memory/held_counts.py: the held activations counted once per schedule and weighed per
partition give held_activations' peak bytes (to rounding) for every registered schedule,
with Slicer halves, split backwards, chunks, replicas and uneven sizes."""

from __future__ import annotations

import random

import pytest

from pipeweave.memory import held_activations
from pipeweave.memory.held_counts import held_peak_bytes
from pipeweave.planner import Plan
from pipeweave.schedules import available_schedules, build_schedule

NAMES = [info.name for info in available_schedules()]


@pytest.mark.parametrize("name", NAMES)
def test_counted_once_weighed_like_the_walk(name: str) -> None:
    info = next(i for i in available_schedules() if i.name == name)
    chunks = info.default_chunks
    iterations = 1 if info.synchronous else 3
    checked = 0
    for depth, microbatches, width in ((2, 4, 1), (4, 8, 1), (4, 8, 2)):
        plan = Plan.uniform(depth * chunks * 2, depth, chunks=chunks, schedule=name,
                            microbatches=microbatches, width=width)
        try:
            schedule = build_schedule(name, plan.shape(iterations))
        except ValueError:
            continue
        for seed in range(3):  # the same schedule, other sizes: the cached counts reused
            rng = random.Random(seed)
            sizes = [rng.uniform(1e6, 5e8) for _ in range(schedule.num_stages)]
            expected = held_activations(schedule, sizes)[1]
            got = held_peak_bytes(schedule, sizes)
            assert got == pytest.approx(expected, rel=1e-12), name
            checked += 1
    assert checked >= 3, name
