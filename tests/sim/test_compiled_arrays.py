"""The compiled walk built from programs as columns (sim/compiled_arrays.py) gives
simulate_timing's makespan, iteration time, window and bubble to the last bit, on many
shapes, uneven costs, transfers, latencies, updates and all-reduces; and the search's timing
(auto/timing.time_plan) takes that path and still equals the simulator."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from pipeweave.auto import timing as timing_module
from pipeweave.auto.copies import one_copy_schedule
from pipeweave.planner.plan import Plan
from pipeweave.schedules import Shape, build_schedule
from pipeweave.schedules.flush_arrays import flush_arrays
from pipeweave.sim import Costs, simulate_timing
from pipeweave.sim.compiled_arrays import compile_arrays, time_arrays

from schedule_grid import random_costs

GRID = list(itertools.product((1, 2, 3, 6), (1, 2, 3), (1, 3, 6, 12, 24), (1, 2)))


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved-1f1b", "gpipe-grouped", "zb-h1",
                                  "zb-h2", "interleaved-zb", "zbv", "v-half", "v-min",
                                  "dualpipev", "avgpipe", "sliced-1f1b"])
def test_timing_from_columns_is_the_simulators(name: str) -> None:
    timed = 0
    for stages, chunks, microbatches, iterations in GRID:
        shape = Shape(stages=stages, microbatches=microbatches, chunks=chunks,
                      iterations=iterations)
        columns = flush_arrays(name, shape)
        if columns is None:
            continue
        compiled = compile_arrays(columns)
        schedule = build_schedule(name, shape)
        for seed, latency in ((0, 0.01), (1, 0.0), (2, 0.3)):
            costs = random_costs(stages * chunks, seed + stages, latency=latency) \
                if stages * chunks > 1 else Costs(forward=1.3, backward=2.1, update=0.4)
            costs = replace(costs, average=[0.1 + 0.2 * s for s in range(stages * chunks)])
            assert time_arrays(columns, compiled, costs) == simulate_timing(schedule, costs)
        timed += 1
    assert timed >= 24


def test_shared_cores_are_left_to_their_walk() -> None:
    columns = flush_arrays("1f1b", Shape(stages=4, microbatches=8))
    assert columns is not None
    costs = random_costs(4, 0, cores=2)
    assert time_arrays(columns, compile_arrays(columns), costs) is None


@pytest.mark.parametrize("schedule, chunks, width", [("1f1b", 1, 2), ("interleaved-1f1b", 2, 2),
                                                     ("gpipe", 1, 1), ("1f1b", 1, 1),
                                                     ("gpipe-grouped", 3, 2), ("zb-h1", 1, 2),
                                                     ("zb-h2", 1, 1), ("zbv", 2, 2),
                                                     ("dualpipev", 2, 1),
                                                     ("interleaved-zb", 2, 2),
                                                     ("avgpipe", 1, 2), ("sliced-1f1b", 1, 2)])
def test_time_plan_takes_the_columns_and_agrees(schedule: str, chunks: int, width: int) -> None:
    plan = Plan.uniform(24, 4, chunks=chunks, schedule=schedule, microbatches=16, width=width)
    costs = random_costs(4 * chunks, 5)
    one_copy = width > 1
    reference = one_copy_schedule(plan, 1) if one_copy else build_schedule(
        schedule, plan.shape(1))
    assert timing_module._columns(plan, 1, one_copy) is not None
    assert timing_module.time_plan(plan, costs, 1, one_copy=one_copy) == simulate_timing(
        reference, costs)


@pytest.mark.parametrize("stages, microbatches", [(2, 3), (2, 5), (3, 8), (5, 12), (6, 6)])
def test_slicer_halves_time_as_the_simulators(stages: int, microbatches: int) -> None:
    """Sliced 1F1B's halves (half the compute, or the half costs given, with the backward
    of a halved micro-batch two half backwards; half the transfer; the same half upstream)
    on every count of sliced micro-batches, given or from Algorithm 2's costs."""
    costs = random_costs(stages, stages, latency=0.05)
    given = [{"sliced": k} for k in range(microbatches + 1)]
    given.append({"costs": (list(costs.forward), list(costs.backward), 0.2)})  # type: ignore
    for options in given:
        for iterations in (1, 2):
            shape = Shape(stages=stages, microbatches=microbatches, iterations=iterations,
                          options=options)
            columns = flush_arrays("sliced-1f1b", shape)
            assert columns is not None
            schedule = build_schedule("sliced-1f1b", shape)
            assert columns.programs() == schedule.programs, options
            compiled = compile_arrays(columns)
            assert time_arrays(columns, compiled, costs) == simulate_timing(schedule, costs)
            dearer = replace(costs, half_forward=[0.6 * f for f in costs.forward],
                             half_backward=[0.55 * b for b in costs.backward])
            assert time_arrays(columns, compiled, dearer) == simulate_timing(schedule, dearer)


def test_slicer_costs_of_one_count_share_one_layout() -> None:
    """Partitions whose Slicer costs give the same count are laid out once
    (``columns_shape``), and each is timed as the simulator times its own schedule."""
    costs = random_costs(4, 7)
    options = [{"costs": ([1.0] * 4, [2.0 + 0.001 * i] * 4, 0.0)} for i in range(3)]
    plans = [Plan.uniform(24, 4, schedule="sliced-1f1b", microbatches=12, width=2,
                          schedule_options=o) for o in options]
    laid_out = [timing_module._columns(plan, 1, True) for plan in plans]
    assert laid_out[0] is not None and all(c is laid_out[0] for c in laid_out)
    for plan in plans:
        assert timing_module.time_plan(plan, costs, 1, one_copy=True) == simulate_timing(
            one_copy_schedule(plan, 1), costs)


def test_bounds_refuse_slicer_halves_from_columns_as_from_actions() -> None:
    """The program and window bounds read no halves (a half's ``F`` costs less than ``f``):
    from columns, as from actions, they give nothing for a sliced shape."""
    from pipeweave.auto.program_bound import program_counts
    from pipeweave.auto.window_bound import stage_windows
    shape = Shape(stages=3, microbatches=6, options={"sliced": 2})
    columns = flush_arrays("sliced-1f1b", shape)
    assert columns is not None and columns.piece is not None and columns.piece.any()
    schedule = build_schedule("sliced-1f1b", shape)
    assert program_counts(schedule, 3) is None and program_counts(columns, 3) is None
    assert stage_windows(schedule) is None and stage_windows(columns) is None
    whole = flush_arrays("sliced-1f1b", Shape(stages=3, microbatches=6, options={"sliced": 0}))
    assert whole is not None and program_counts(whole, 3) is not None
