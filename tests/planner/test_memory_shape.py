"""The memory model's shape cache (planner/memory_shape.py) changes no number: every partition
of a shape, asked one after another through the cache, gets exactly what a fresh analysis
gives, for every registered schedule (with recomputation and a split-backward profile too)."""

from __future__ import annotations

import random

import pytest

from pipeweave.planner import Plan
from pipeweave.planner.memory import predicted_memory
from pipeweave.planner.memory_shape import clear_shape_cache, shape_analysis
from pipeweave.schedules import available_schedules, build_schedule

from schedule_grid import random_memory_profile

BLOCKS = 12


def _partitions(stages: int, rng: random.Random) -> list[tuple[tuple[int, int], ...]]:
    """Three different splits of the blocks into ``stages`` contiguous stages."""
    found: list[tuple[tuple[int, int], ...]] = []
    while len(found) < 3:
        cuts = sorted(rng.sample(range(1, BLOCKS), stages - 1))
        edges = [0, *cuts, BLOCKS]
        split = tuple(zip(edges, edges[1:]))
        if split not in found:
            found.append(split)
    return found


@pytest.mark.parametrize("name", [info.name for info in available_schedules()])
def test_cached_analysis_gives_the_fresh_numbers(name: str) -> None:
    info = next(i for i in available_schedules() if i.name == name)
    chunks = info.default_chunks
    rng = random.Random(name)
    profile = random_memory_profile(3, BLOCKS)
    splits = _partitions(2 * chunks, rng)
    # with and without recomputation: the same shape, different forwards keep their graph
    plans = [Plan(num_blocks=BLOCKS, stages=split, schedule=name, microbatches=8, chunks=chunks,
                  recompute=(True,) * len(split) if recompute else ())
             for recompute in (False, True, False) for split in splits]
    fresh = []
    for plan in plans:
        clear_shape_cache()
        fresh.append(predicted_memory(profile, plan, batch_size=16))
    clear_shape_cache()
    cached = [predicted_memory(profile, plan, batch_size=16) for plan in plans]
    assert cached == fresh, name  # exact: the same sums in the same order
    # and the partitions did share one analysis
    iterations = 1 if info.synchronous else 3
    assert shape_analysis(name, plans[0].shape(iterations)) is \
        shape_analysis(name, plans[-1].shape(iterations))

def test_partitions_of_one_shape_differ_in_bytes() -> None:
    """The cache is keyed by shape, not by plan: a different split must still change the
    numbers (a cache that returned the first plan's result would fail here)."""
    clear_shape_cache()
    profile = random_memory_profile(5, BLOCKS)
    first = predicted_memory(profile, Plan(num_blocks=BLOCKS, stages=((0, 2), (2, 12)),
                                           schedule="1f1b", microbatches=4), batch_size=4)
    second = predicted_memory(profile, Plan(num_blocks=BLOCKS, stages=((0, 10), (10, 12)),
                                            schedule="1f1b", microbatches=4), batch_size=4)
    assert first[0].parameters == sum(b.parameter_bytes for b in profile.blocks[:2])
    assert second[0].parameters == sum(b.parameter_bytes for b in profile.blocks[:10])
    assert first[0].total != second[0].total


def test_the_cache_is_bounded() -> None:
    from pipeweave.planner import memory_shape
    from pipeweave.schedules import Shape

    clear_shape_cache()
    for m in range(1, memory_shape.CACHE_SIZE + 4):
        shape_analysis("gpipe", Shape(stages=2, microbatches=m))
    assert len(memory_shape._CACHE) == memory_shape.CACHE_SIZE
    assert build_schedule("gpipe", Shape(stages=2, microbatches=1)).num_ranks == 2


def test_the_analysis_leaves_the_collector_as_it_found_it() -> None:
    """The collector is paused only while a shape is analysed (``_no_collection``)."""
    import gc

    from pipeweave.schedules import Shape

    was = gc.isenabled()
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            clear_shape_cache()
            shape_analysis("1f1b", Shape(stages=3, microbatches=6))
            assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
