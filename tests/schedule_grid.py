"""Shared by the walk's tests (sim, auto's timing, the held counts, the memory model): every
registered schedule built on a small grid of shapes, a random cost table for it, and a
random profile whose blocks' bytes the memory model reads."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator

from pipeweave.ir import Schedule
from pipeweave.planner import Plan
from pipeweave.profiler import BlockProfile, Profile
from pipeweave.schedules import available_schedules, build_schedule
from pipeweave.sim import Costs

__all__ = ["random_costs", "random_memory_profile", "schedules_on_grid"]


def schedules_on_grid(name: str, shapes: Iterable[tuple[int, int, int]], *,
                      async_iterations: int) -> Iterator[tuple[Plan, int, Schedule]]:
    """``name`` at each ``(depth, microbatches, width)`` it takes, at its default chunks and
    two blocks a stage: the plan, the iterations lowered (1 for a synchronous schedule,
    ``async_iterations`` for an asynchronous one) and the schedule."""
    info = next(i for i in available_schedules() if i.name == name)
    chunks = info.default_chunks
    iterations = 1 if info.synchronous else async_iterations
    for depth, microbatches, width in shapes:
        plan = Plan.uniform(depth * chunks * 2, depth, chunks=chunks, schedule=name,
                            microbatches=microbatches, width=width)
        try:
            schedule = build_schedule(name, plan.shape(iterations))
        except ValueError:
            continue  # the schedule does not take this shape
        yield plan, iterations, schedule


def random_costs(stages: int, seed: int, *, latency: float = 0.01,
                 cores: int | None = None) -> Costs:
    """Forward, backward, W, messages, updates and all-reduces drawn per stage from ``seed``."""
    rng = random.Random(seed)
    return Costs(forward=[rng.uniform(0.5, 2) for _ in range(stages)],
                 backward=[rng.uniform(1, 4) for _ in range(stages)],
                 weight_grad=[rng.uniform(0.2, 0.9) for _ in range(stages)],
                 comm=[rng.uniform(0, 0.5) for _ in range(stages - 1)], latency=latency,
                 update=[rng.uniform(0, 1) for _ in range(stages)],
                 all_reduce=[rng.uniform(0, 2) for _ in range(stages)], shared_cores=cores)


def random_memory_profile(seed: int, blocks: int) -> Profile:
    """``blocks`` blocks of random times and bytes (saved, output, parameters, pending,
    recorded, workspace), one sample a micro-batch."""
    rng = random.Random(seed)
    return Profile(tuple(
        BlockProfile(f"b{i}", 1.0, 2.0, rng.uniform(1, 50), rng.uniform(10, 500),
                     rng.uniform(100, 5000), input_grad=1.2, weight_grad=0.8,
                     pending_bytes=rng.uniform(0, 20), recorded_bytes=rng.uniform(0, 30),
                     peak_memory_bytes=rng.uniform(500, 3000))
        for i in range(blocks)), batch_size=1, input_bytes=7.0)
