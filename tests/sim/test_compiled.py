"""The compiled walk (sim/compiled.py) times every action exactly as the Python walk does, for
every registered schedule (compute-only and lowered, with Slicer halves, all-reduces, uneven
costs and transfers, several iterations), and the simulator uses it from a schedule's second
timing on with the same results."""

from __future__ import annotations

import pytest

from pipeweave.ir import lower
from pipeweave.ir.walk import index_actions
from pipeweave.ir.walk import walk
from pipeweave.schedules import available_schedules
from pipeweave.sim import simulate, simulate_path, simulate_timing
from pipeweave.sim import compiled as compiled_module
from pipeweave.sim.compiled import compile_schedule
from pipeweave.sim.simulator import _delay_fn, _duration_fn

from schedule_grid import random_costs, schedules_on_grid

NAMES = [info.name for info in available_schedules()]


SHAPES = ((2, 4, 1), (4, 8, 1), (4, 8, 2), (8, 16, 1))


def _schedules(name: str):  # type: ignore[no-untyped-def]
    for _, _, schedule in schedules_on_grid(name, SHAPES, async_iterations=3):
        yield schedule.num_stages, schedule


@pytest.mark.parametrize("name", NAMES)
def test_compiled_times_equal_the_walk(name: str) -> None:
    checked = 0
    for stages, schedule in _schedules(name):
        for shown in (schedule, lower(schedule)):
            index = index_actions(shown)
            compiled = compile_schedule(shown, index, min_width=0)
            assert compiled is not None
            for seed, latency in ((0, 0.01), (1, 0.0)):
                costs = random_costs(stages, seed, latency=latency)
                table = costs.resolve(stages)
                plain = walk(shown, _duration_fn(table), _delay_fn(table), index=index)
                start, end = compiled.times(table)
                assert compiled.rows(start) == plain.start, name
                assert compiled.rows(end) == plain.end, name
                checked += 1
    assert checked >= 4, name


@pytest.mark.parametrize("name", ["1f1b", "zb-h2", "interleaved-1f1b", "sliced-1f1b", "zbv"])
def test_the_simulator_uses_it_from_the_second_timing(name: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiled_module, "MIN_WIDTH", 0)  # compile even these small ones
    stages, schedule = list(_schedules(name))[-1]
    costs = random_costs(stages, 3)
    first = simulate_timing(schedule, costs)
    assert compiled_module.compiled_for(schedule, index_actions(schedule)) is not None
    again = simulate_timing(schedule, costs)  # compiled now
    assert again == first
    full = simulate(schedule, costs)
    assert (full.iteration_time, full.bubble_fraction) == (first.iteration_time,
                                                           first.bubble_fraction)
    assert simulate_path(schedule, costs) == simulate_path(schedule, costs)
    assert simulate_path(schedule, costs).iteration_time == full.iteration_time
    assert simulate_path(schedule, costs).master_stage == full.master_stage


def test_a_deadlock_is_left_to_the_walk() -> None:
    stages, schedule = list(_schedules("1f1b"))[-1]
    swapped = [list(p) for p in schedule.programs]
    swapped[0].reverse()  # rank 0 waits for a backward before its first forward
    broken = type(schedule)(**{**schedule.__dict__, "programs": tuple(map(tuple, swapped))})
    assert compile_schedule(broken, index_actions(broken), min_width=0) is None


def test_narrow_schedules_are_walked() -> None:
    _, schedule = list(_schedules("1f1b"))[0]  # 2 ranks: about 1 action per level
    assert compile_schedule(schedule, index_actions(schedule)) is None


@pytest.mark.parametrize("name", NAMES)
def test_levels_equal_a_walk_of_unit_actions(name: str) -> None:
    """:func:`longest_chains` over the edges gives every action the start a walk with every
    action lasting 1 (and no delay) gives it: the levels the compilation orders by."""
    from pipeweave.sim.compiled import _edges, longest_chains
    import numpy as np
    for _, schedule in _schedules(name):
        for shown in (schedule, lower(schedule)):
            index = index_actions(shown)
            lengths = [len(p) for p in shown.programs]
            edges = _edges(shown, index, np.cumsum([0] + lengths))
            level = longest_chains(edges[0], edges[1], sum(lengths))
            counted = walk(shown, lambda _rank, _action: 1.0, None, index=index)
            assert level is not None
            assert level.tolist() == [int(t) for row in counted.start for t in row], name


def test_a_missing_action_is_left_to_the_walk() -> None:
    _, schedule = list(_schedules("1f1b"))[-1]
    programs = [list(p) for p in schedule.programs]
    programs[1] = programs[1][1:]  # rank 1's first forward is gone: rank 2 waits for it
    broken = type(schedule)(**{**schedule.__dict__, "programs": tuple(map(tuple, programs))})
    assert compile_schedule(broken, index_actions(broken), min_width=0) is None


def test_a_schedule_expected_to_be_timed_again_is_compiled_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiled_module, "MIN_WIDTH", 0)
    stages, schedule = list(_schedules("zb-h1"))[-1]
    rebuilt = type(schedule)(**schedule.__dict__)  # a new object: nothing remembered of it
    index = index_actions(rebuilt)
    compiled_module.expect_timings(rebuilt)
    assert compiled_module.compiled_for(rebuilt, index) is not None  # no walk first
    costs = random_costs(stages, 4)
    assert simulate_path(rebuilt, costs, index=index) == simulate_path(schedule, costs)


def test_the_index_is_kept_per_schedule_object() -> None:
    import importlib
    walk_module = importlib.import_module("pipeweave.ir.walk")
    _, schedule = list(_schedules("interleaved-1f1b"))[-1]
    kept = index_actions(schedule)
    assert index_actions(schedule) is kept
    rebuilt = type(schedule)(**schedule.__dict__)
    fresh = walk_module._index(rebuilt)
    assert index_actions(rebuilt) == fresh == kept  # equal, built anew for the new object
    assert index_actions(rebuilt) is not kept


def test_a_dead_schedule_leaves_no_index_behind() -> None:
    import gc
    import importlib
    walk_module = importlib.import_module("pipeweave.ir.walk")
    _, schedule = list(_schedules("1f1b"))[-1]
    rebuilt = type(schedule)(**schedule.__dict__)
    index_actions(rebuilt)
    key = id(rebuilt)
    assert key in walk_module._indexes
    del rebuilt
    gc.collect()
    assert key not in walk_module._indexes
