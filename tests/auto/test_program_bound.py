"""auto/program_bound.py: each rank's fill and drain read off its program stays below the
simulated time of every candidate of a space (every synchronous schedule, partitions,
recomputation, width, a two-level topology), close enough that a 5 % inflation fails, and
above the plan bound on many."""

from __future__ import annotations

import dataclasses

from auto_fixtures import small_profile
from test_bounds import _simulated
from pipeweave.auto import AutoProblem
from pipeweave.auto.bounds import plan_bound
from pipeweave.auto.program_bound import plan_program_bound
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
