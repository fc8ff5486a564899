"""auto/program_bound.py: each rank's fill and drain read off its program stays below the
simulated time of every candidate of a space (every synchronous schedule, partitions,
recomputation, width, a two-level topology), close enough that a 5 % inflation fails, and
above the plan bound on many."""

from __future__ import annotations

import dataclasses

import pytest

from auto_fixtures import small_profile
from test_bounds import _simulated
from pipeweave.auto import AutoProblem
from pipeweave.auto.bounds import plan_bound
from pipeweave.auto.program_bound import plan_program_bound, program_bound
from pipeweave.planner import Plan
from pipeweave.schedules import build_schedule
from pipeweave.schedules.flush_arrays import flush_arrays
from pipeweave.sim import Costs
from pipeweave.planner.topology import Topology
from pipeweave.profiler import LinkProfile


def _problem(**changes: object) -> AutoProblem:
    profile = small_profile(8, blocks=12, link=LinkProfile(1e9, 1e-5))
    problem = AutoProblem(profile=profile, ranks=4, topology=Topology.parse("2x1e10,2x1e8"),
                          methods=("uniform", "time"), microbatches=(4, 8, 16),
                          recompute=(0, 2, 12))
    return dataclasses.replace(problem, **changes)


def test_below_the_simulated_time_of_every_candidate() -> None:
    problem = _problem()
    checked = close = raised = 0
    schedules = set()
    for _, plan, _, costs, time in _simulated(problem):
        bound = plan_program_bound(plan, costs, problem)
        assert bound <= time * (1 + 1e-9), (plan.schedule, plan, bound, time)
        if bound > 0:
            schedules.add(plan.schedule)
            checked += 1
            close += bound * 1.05 > time
            raised += bound > 1.02 * plan_bound(plan, costs, problem)
    assert checked > 100 and close > checked // 10 and raised > checked // 10, \
        (checked, close, raised)
    assert {"1f1b", "gpipe", "zb-h1", "zb-h2", "interleaved-1f1b", "interleaved-zb",
            "v-half", "v-min", "zbv", "dualpipev"} <= schedules, schedules


def test_no_bound_where_the_chain_does_not_hold() -> None:
    """Sliced micro-batches (halves cost less than a forward) and shared cores."""
    checked = 0
    sliced = _problem(schedules=("sliced-1f1b",), recompute=(0,))
    for _, plan, _, costs, _ in _simulated(sliced):
        assert plan_program_bound(plan, costs, sliced) == 0.0
        checked += 1
    shared = _problem(schedules=("1f1b",), recompute=(0,), shared_cores=2)
    for _, plan, _, costs, _ in _simulated(shared):
        assert plan_program_bound(plan, costs, shared) == 0.0
        checked += 1
    assert checked > 10


def test_columns_and_actions_give_the_same_bound() -> None:
    """The programs laid out as columns (schedules/flush_arrays.py) are read in numpy, the
    generators' actions in Python: the same bound on random costs, for every schedule the
    columns cover."""
    import random

    rng = random.Random(1)
    compared = 0
    for name, chunks in (("1f1b", 1), ("gpipe", 1), ("zb-h1", 1), ("zb-h2", 1),
                         ("interleaved-1f1b", 2), ("interleaved-zb", 2), ("v-half", 2),
                         ("v-min", 2), ("zbv", 2), ("dualpipev", 2)):
        plan = Plan.uniform(12, 3, chunks=chunks, schedule=name, microbatches=12)
        shape = plan.shape(1)
        columns = flush_arrays(name, shape, reduce_before_step=False)
        if columns is None:
            continue
        stages = 3 * chunks
        forward = [rng.uniform(0.5, 2) for _ in range(stages)]
        table = Costs(forward=forward, backward=[2 * f for f in forward],
                      update=[0.1] * stages, all_reduce=[0.3] * stages).resolve(stages)
        split = name.startswith(("zb", "interleaved-zb", "v-", "zbv", "dualpipev"))
        from_columns = program_bound(columns, table, split=split)
        from_actions = program_bound(build_schedule(name, shape), table, split=split)
        assert from_columns == from_actions > 0, name
        compared += 1
    assert compared >= 6, compared


def test_kept_per_shape_the_same_bound_with_one_build_per_shape(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What the bound reads is kept per shape: every partition of a shape after the first is
    bounded without its programs (floor_programs asked once per shape), and to the same
    number as a fresh read of freshly built programs."""
    import pipeweave.auto.program_bound as module
    from pipeweave.auto.predict import one_copy_suffices
    from pipeweave.auto.timing import floor_programs
    from pipeweave.auto.window_bound import window_bound
    from pipeweave.schedules import get_info

    module._READS.clear()
    asked: list[object] = []
    real = module.floor_programs

    def counted(plan: Plan, *, one_copy: bool) -> object:
        asked.append((plan.schedule, plan.shape(1), one_copy))
        return real(plan, one_copy=one_copy)

    monkeypatch.setattr(module, "floor_programs", counted)
    problem = _problem(methods=("uniform", "time", "parameters"))
    checked = 0
    for _, plan, _, costs, _ in _simulated(problem):
        bound = plan_program_bound(plan, costs, problem)
        if bound == 0:
            continue
        programs = floor_programs(plan, one_copy=one_copy_suffices(plan, problem))
        table = costs.resolve(len(plan.stages))
        split = get_info(plan.schedule).split_backward
        assert bound == max(program_bound(programs, table, split=split),
                            window_bound(programs, table, programs.layout, split=split))
        checked += 1
    assert checked > 100 and len(asked) == len(set(asked)) and len(asked) < checked // 2, \
        (checked, len(asked))
