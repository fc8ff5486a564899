"""auto.memory.memory_floor never exceeds the memory model's peak (so pruning on it never
drops a candidate that fits), for every synchronous schedule, one copy and whole plans,
recomputation on and off, and it is not vacuous: activations make up most of it somewhere."""

from __future__ import annotations

from auto_fixtures import completed_candidates, small_profile
from pipeweave.auto import AutoProblem
from pipeweave.auto.memory import memory_floor, rank_memory
from pipeweave.auto.timing import floor_programs
from pipeweave.planner.topology import Topology
from pipeweave.profiler import LinkProfile
from pipeweave.schedules.flush_arrays import ArrayPrograms


def test_floor_is_below_the_memory_model() -> None:
    profile = small_profile(5, blocks=8, link=LinkProfile(2e8, 2e-5))
    problem = AutoProblem(profile=profile, ranks=4, topology=Topology.parse("2x1e9,2x1e8"),
                          methods=("uniform", "time", "pipedream"), microbatches=(4, 16),
                          pipelines=(1, 2))
    checked = tight = one_copy_seen = 0
    for candidate, plan, schedule, one_copy in completed_candidates(problem,
                                                                    synchronous_only=True):
        floor = memory_floor(problem, plan, schedule, one_copy=one_copy)
        model = rank_memory(problem, plan, one_copy=one_copy)
        for rank, value in enumerate(floor):
            assert value <= model[rank] * (1 + 1e-12), (candidate, rank)
        tight += max(floor) >= 0.9 * max(model)
        one_copy_seen += one_copy
        checked += 1
    assert checked > 100 and one_copy_seen > 10 and tight > checked // 5


def test_floor_from_columns_is_the_floor_from_the_schedule() -> None:
    """The search hands the memory floor the programs as columns where they exist
    (auto/timing.floor_programs): the same floor, to the last bit, as from the schedule."""
    profile = small_profile(5, blocks=8, link=LinkProfile(2e8, 2e-5))
    problem = AutoProblem(profile=profile, ranks=4, topology=Topology.parse("2x1e9,2x1e8"),
                          methods=("uniform", "time"), microbatches=(4, 16))
    columns = 0
    for _, plan, schedule, one_copy in completed_candidates(problem, synchronous_only=True):
        programs = floor_programs(plan, one_copy=one_copy)
        if isinstance(programs, ArrayPrograms):
            columns += 1
            assert memory_floor(problem, plan, programs, one_copy=one_copy) == memory_floor(
                problem, plan, schedule, one_copy=one_copy), plan
    assert columns > 20
