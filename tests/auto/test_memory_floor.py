"""auto.memory.memory_floor never exceeds the memory model's peak (so pruning on it never
drops a candidate that fits), for every synchronous schedule, one copy and whole plans,
recomputation on and off, and it is not vacuous: activations make up most of it somewhere."""

from __future__ import annotations

from auto_fixtures import small_profile
from pipeweave.auto import AutoProblem, enumerate_candidates
from pipeweave.auto.memory import memory_floor, rank_memory
from pipeweave.auto.predict import one_copy_suffices
from pipeweave.auto.search import _Search, _valid_shape
from pipeweave.auto.timing import plan_schedule
from pipeweave.planner.topology import Topology
from pipeweave.profiler import LinkProfile
from pipeweave.schedules import get_info


def test_floor_is_below_the_memory_model() -> None:
    profile = small_profile(5, blocks=8, link=LinkProfile(2e8, 2e-5))
    problem = AutoProblem(profile=profile, ranks=4, topology=Topology.parse("2x1e9,2x1e8"),
                          methods=("uniform", "time", "pipedream"), microbatches=(4, 16),
                          pipelines=(1, 2))
    state = _Search(problem, lambda _text: None)
    checked = tight = one_copy_seen = 0
    for candidate in enumerate_candidates(problem):
        if not _valid_shape(candidate, problem) or not get_info(candidate.schedule).synchronous:
            continue
        try:
            _, plan, _ = state.complete(candidate)
            one_copy = one_copy_suffices(plan, problem)
            schedule = plan_schedule(plan, 1, one_copy=one_copy)
        except ValueError:
            continue  # the schedule refuses the plan (the search counts it invalid)
        floor = memory_floor(problem, plan, schedule, one_copy=one_copy)
        model = rank_memory(problem, plan, one_copy=one_copy)
        for rank, value in enumerate(floor):
            assert value <= model[rank] * (1 + 1e-12), (candidate, rank)
        tight += max(floor) >= 0.9 * max(model)
        one_copy_seen += one_copy
        checked += 1
    assert checked > 100 and one_copy_seen > 10 and tight > checked // 5
