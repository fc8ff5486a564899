"""auto/window_bound.py: the micro-batches a stage keeps open bound its pace. The bound stays
below the simulated time of every candidate of a space (every synchronous schedule,
partitions, recomputation, width, replicated stages, a two-level topology with slow links),
a 5 % inflation of it fails, and the windows read off columns and off actions agree."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest

from auto_fixtures import small_profile
from test_bounds import _simulated
from pipeweave.auto import AutoProblem
from pipeweave.auto.bounds import plan_bound
from pipeweave.auto.predict import one_copy_suffices
from pipeweave.auto.timing import floor_programs
from pipeweave.auto.fill_bound import WINDOWS
from pipeweave.auto.window_bound import declared_window_bound, stage_windows, window_bound
from pipeweave.planner import Plan
from pipeweave.planner.topology import Topology
from pipeweave.profiler import LinkProfile
from pipeweave.schedules import build_schedule, get_info
from pipeweave.schedules.flush_arrays import flush_arrays
from pipeweave.sim import Costs, simulate


def _problem(**changes: object) -> AutoProblem:
    # slow links: transfers as long as a stage's compute, where the windows bind
    profile = small_profile(8, blocks=12, link=LinkProfile(2e7, 1e-4))
    problem = AutoProblem(profile=profile, ranks=4, topology=Topology.parse("2x1e9,2x2e7"),
                          methods=("uniform", "time", "pipedream"), microbatches=(4, 8, 16),
                          recompute=(0, 2, 12))
    return dataclasses.replace(problem, **changes)


def _bound(plan: Plan, costs: Costs, problem: AutoProblem) -> float:
    programs = floor_programs(plan, one_copy=one_copy_suffices(plan, problem))
    return window_bound(programs, costs.resolve(len(plan.stages)), programs.layout,
                        split=get_info(plan.schedule).split_backward)


def test_below_the_simulated_time_of_every_candidate() -> None:
    problem = _problem()
    checked = close = raised = 0
    schedules = set()
    for _, plan, _, costs, time in _simulated(problem):
        if plan.schedule == "sliced-1f1b" or plan.pipelines > 1:
            continue
        bound = _bound(plan, costs, problem)
        assert bound <= time * (1 + 1e-9), (plan.schedule, plan, bound, time)
        if bound > 0:
            schedules.add(plan.schedule)
            checked += 1
            close += bound * 1.05 > time  # a 5 % inflation would cut these
            raised += bound > 1.02 * plan_bound(plan, costs, problem)
    assert checked > 100 and close > checked // 20 and raised > checked // 20, \
        (checked, close, raised)
    assert {"1f1b", "gpipe", "zb-h1", "zb-h2", "interleaved-1f1b", "interleaved-zb",
            "v-half", "v-min", "zbv", "dualpipev", "avgpipe"} <= schedules, schedules


def test_one_f_one_b_with_slow_links_is_bound_by_its_windows() -> None:
    """1F1B on 6 stages, transfers twice a stage's compute: the round trip of stage 0's six
    open micro-batches sets the pace, 85 % of the simulated time, over four times the
    busiest rank's work."""
    stages, n = 6, 24
    plan = Plan.uniform(12, stages, schedule="1f1b", microbatches=n)
    schedule = build_schedule("1f1b", plan.shape(1))
    costs = Costs(forward=[1.0] * stages, backward=[2.0] * stages, comm=6.0,
                  update=[0.1] * stages)
    table = costs.resolve(stages)
    time = simulate(schedule, costs).iteration_time
    bound = window_bound(schedule, table, schedule.layout, split=False)
    assert bound <= time * (1 + 1e-9) and bound > 0.84 * time, (bound, time)
    assert bound > 4 * n * 3.0, bound


def test_columns_and_actions_give_the_same_windows() -> None:
    rng = random.Random(3)
    compared = 0
    for name, chunks in (("1f1b", 1), ("gpipe", 1), ("zb-h1", 1), ("zb-h2", 1),
                         ("interleaved-1f1b", 2), ("interleaved-zb", 2), ("v-half", 2),
                         ("v-min", 2), ("zbv", 2), ("dualpipev", 2)):
        plan = Plan.uniform(12, 3, chunks=chunks, schedule=name, microbatches=12)
        columns = flush_arrays(name, plan.shape(1))
        if columns is None:
            continue
        actions = build_schedule(name, plan.shape(1))
        stages = 3 * chunks
        forward = [rng.uniform(0.5, 2) for _ in range(stages)]
        table = Costs(forward=forward, backward=[2 * f for f in forward], comm=0.7,
                      update=[0.1] * stages).resolve(stages)
        split = get_info(name).split_backward
        a, b = stage_windows(columns), stage_windows(actions)
        assert a is not None and b is not None
        order_a = np.lexsort((a.stage, a.rank))
        order_b = np.lexsort((b.stage, b.rank))
        for field in ("rank", "stage", "forwards", "most"):
            assert (getattr(a, field)[order_a] == getattr(b, field)[order_b]).all(), (name, field)
        assert window_bound(columns, table, columns.layout, split=split) == \
            window_bound(actions, table, actions.layout, split=split) > 0, name
        compared += 1
    assert compared >= 8, compared


def test_one_f_one_b_keeps_its_warm_up_open() -> None:
    """1F1B's windows are its warm-up plus one: ``min(n, S - s)`` on stage ``s``."""
    plan = Plan.uniform(8, 4, schedule="1f1b", microbatches=6)
    windows = stage_windows(build_schedule("1f1b", plan.shape(1)))
    assert windows is not None
    assert windows.most[np.argsort(windows.stage)].tolist() == [4, 3, 2, 1]
    assert windows.forwards.tolist() == [6] * 4


def test_no_bound_for_sliced_micro_batches() -> None:
    problem = _problem(schedules=("sliced-1f1b",), recompute=(0,))
    checked = 0
    for _, plan, _, costs, _ in _simulated(problem):
        assert _bound(plan, costs, problem) == 0.0
        checked += 1
    assert checked > 5


def test_declared_windows_are_the_generated_ones() -> None:
    """fill_bound.WINDOWS' ``k_s`` is the most micro-batches 1F1B and AvgPipe's one
    pipeline keep open on stage ``s``, on a grid of depths and micro-batch counts, so the
    bound before the schedule is built is the bound read off it."""
    compared = 0
    for name in ("1f1b", "avgpipe"):
        for stages in (1, 2, 3, 5, 8):
            for n in (1, 2, 3, 7, 8, 16):
                plan = Plan.uniform(8, stages, schedule=name, microbatches=n)
                try:
                    schedule = build_schedule(name, plan.shape(1))
                except ValueError:
                    continue
                windows = stage_windows(schedule)
                assert windows is not None
                declared = [WINDOWS[name](s, stages, n)[0] for s in range(stages)]
                assert windows.most[np.argsort(windows.stage)].tolist() == declared, \
                    (name, stages, n)
                compared += 1
    assert compared > 40, compared


def test_declared_bound_equals_the_bound_read_off_the_programs() -> None:
    """In the plan bound before anything is built, with width and slow links: the same
    number as the programs give, and above the rest of the plan bound on some."""
    problem = _problem(schedules=("1f1b", "avgpipe"), recompute=(0, 2))
    checked = raised = 0
    for _, plan, _, costs, time in _simulated(problem):
        if plan.replicas is not None or plan.pipelines > 1 or plan.microbatches % plan.width:
            continue
        table = costs.resolve(len(plan.stages))
        declared = declared_window_bound(plan, table)
        assert declared == pytest.approx(_bound(plan, costs, problem), rel=1e-12), plan
        assert plan_bound(plan, costs, problem) <= time * (1 + 1e-9)
        checked += 1
        raised += declared > 1.02 * max(  # the same plan bound without the windows
            plan_bound(dataclasses.replace(plan, schedule="gpipe"), costs, problem), 0)
    assert checked > 20 and raised > 5, (checked, raised)
