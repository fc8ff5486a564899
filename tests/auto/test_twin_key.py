"""auto/twin_key.py: sliced 1F1B plans whose stage costs slice as many micro-batches are
twins. Their schedules are the same actions, and a twin recomputing more stages is never
simulated faster; plans slicing other counts keep apart."""

from __future__ import annotations

from itertools import combinations

from auto_fixtures import small_profile
from test_bounds import _simulated
from pipeweave.auto import AutoProblem
from pipeweave.auto.twin_key import twin_key
from pipeweave.planner import Plan
from pipeweave.planner.topology import Topology
from pipeweave.profiler import LinkProfile
from pipeweave.schedules import Shape, build_schedule
from pipeweave.schedules.sliced import slicer_count


def _problem() -> AutoProblem:
    profile = small_profile(8, blocks=12, link=LinkProfile(1e8, 1e-5))
    return AutoProblem(profile=profile, ranks=4, topology=Topology.parse("2x1e9,2x1e8"),
                       schedules=("sliced-1f1b",), methods=("uniform", "time"),
                       microbatches=(4, 8, 16), recompute=(0, 1, 2, 3, 12))


def _recomputed(plan: Plan) -> tuple[bool, ...]:
    return tuple(plan.recompute_stage(s) for s in range(len(plan.stages)))


def test_a_twin_recomputing_more_is_never_faster() -> None:
    simulated = [(plan.to_json(), _recomputed(plan), time)
                 for _, plan, _, _, time in _simulated(_problem())]
    pairs = renamed = 0
    for (a, more, time_a), (b, fewer, time_b) in combinations(simulated, 2):
        if twin_key(a, False) != twin_key(b, False):
            continue
        if all(m or not f for m, f in zip(more, fewer)):
            assert time_a >= time_b * (1 - 1e-12), (a, b, time_a, time_b)
        if all(f or not m for m, f in zip(more, fewer)):
            assert time_b >= time_a * (1 - 1e-12), (a, b, time_a, time_b)
        pairs += 1
        renamed += a["schedule_options"] != b["schedule_options"]
    assert pairs > 20 and renamed > 10, (pairs, renamed)


def test_the_same_count_builds_the_same_actions() -> None:
    stages, microbatches = 4, 8
    cheap = ([1.0] * stages, [2.0] * stages, 0.5)
    heavier = ([1.0] * stages, [2.2] * stages, 1.0)
    assert slicer_count(*cheap) == slicer_count(*heavier)
    shapes = [Shape(stages=stages, microbatches=microbatches, options={"costs": costs})
              for costs in (cheap, heavier)]
    first, second = (build_schedule("sliced-1f1b", shape) for shape in shapes)
    assert first.programs == second.programs
    data = {"schedule": "sliced-1f1b", "recompute": [False] * stages,
            "schedule_options": {"costs": cheap}}
    assert twin_key(data, False) == twin_key(
        {**data, "recompute": [True] * stages, "schedule_options": {"costs": heavier}}, False)


def test_other_counts_and_other_schedules_keep_apart() -> None:
    stages = 4
    few, many = ([1.0] * stages, [2.0] * stages, 0.0), ([1.0] * stages, [2.0] * stages, 5.0)
    assert slicer_count(*few) != slicer_count(*many)
    data = {"schedule": "sliced-1f1b", "schedule_options": {"costs": few}}
    assert twin_key(data, False) != twin_key({**data, "schedule_options": {"costs": many}},
                                             False)
    other = {"schedule": "1f1b", "schedule_options": {"costs": few}}
    assert twin_key(other, False) != twin_key({**other, "schedule_options": {"costs": many}},
                                              False)
