"""auto/held_floor.py: each schedule's declared held micro-batches never exceed what its
generated schedule holds on that stage, on a grid of depths, chunks and micro-batch counts;
every registered synchronous schedule is listed; and the floor never exceeds memory_floor
(hence the memory model) on every candidate of a small space, nor is it vacuous."""

from __future__ import annotations

from dataclasses import replace

import pytest

from auto_fixtures import completed_candidates, completions, small_profile
from pipeweave.auto import AutoProblem
from pipeweave.auto.floors import StateFloor
from pipeweave.auto.held_floor import HELD_AT_LEAST, held_at_least, held_floor
from pipeweave.auto.memory import memory_floor
from pipeweave.ir import Op, Schedule
from pipeweave.planner import Plan
from pipeweave.planner.topology import Topology
from pipeweave.profiler import LinkProfile
from pipeweave.schedules import available_schedules, build_schedule, get_info

SYNCHRONOUS = [info.name for info in available_schedules() if info.synchronous]


def _stage_peaks(schedule: Schedule) -> dict[int, float]:
    """The most micro-batches each stage holds at once (memory/held.py's rules)."""
    peaks: dict[int, float] = {}
    for program in schedule.programs:
        held: dict[tuple[int, int | None, int], float] = {}
        count: dict[int, float] = {}
        for a in program:
            key = (a.stage, a.microbatch, a.pipeline)
            if a.op is Op.FORWARD:
                share = 0.5 if a.piece else 1.0
                held[key] = held.get(key, 0.0) + share
                count[a.stage] = count.get(a.stage, 0.0) + share
                peaks[a.stage] = max(peaks.get(a.stage, 0.0), count[a.stage])
            elif a.op in (Op.BACKWARD, Op.BACKWARD_WEIGHT):
                count[a.stage] = count.get(a.stage, 0.0) - held.pop(key, 0.0)
    return peaks


def test_every_synchronous_schedule_is_listed() -> None:
    assert set(SYNCHRONOUS) == set(HELD_AT_LEAST)


@pytest.mark.parametrize("name", SYNCHRONOUS)
def test_declared_counts_are_held(name: str) -> None:
    info = get_info(name)
    checked = 0
    chunk_options = {info.default_chunks, 2 * info.default_chunks} if info.default_chunks > 1 \
        else {1}
    for chunks in sorted(chunk_options):
        for depth in (1, 2, 3, 4, 5, 8):
            for microbatches in sorted({1, 2, 3, depth, depth + 1, 2 * depth - 1, 2 * depth,
                                        3 * depth, 4 * depth + 2}):
                plan = Plan.uniform(depth * chunks, depth, chunks=chunks, schedule=name,
                                    microbatches=microbatches)
                try:
                    schedule = build_schedule(name, plan.shape(1))
                except ValueError:
                    continue  # the schedule does not take this shape
                stages = depth * chunks
                for stage, peak in _stage_peaks(schedule).items():
                    declared = held_at_least(name, stage, stages, depth, microbatches)
                    assert declared <= peak, (name, depth, chunks, microbatches, stage, peak)
                checked += 1
    assert checked >= 10, name


def test_floor_is_below_memory_floor_and_not_vacuous() -> None:
    profile = small_profile(7, blocks=8, link=LinkProfile(2e8, 2e-5))
    problem = AutoProblem(profile=profile, ranks=4, topology=Topology.parse("2x1e9,2x1e8"),
                          methods=("uniform", "time", "pipedream"), microbatches=(4, 16))
    checked = tight = 0
    for candidate, plan, schedule, one_copy in completed_candidates(problem):
        floor = held_floor(problem, plan)
        if not floor:
            continue  # replicated stages or N pipelines: no floor
        walked = memory_floor(problem, plan, schedule, one_copy=one_copy)
        for rank, value in enumerate(floor):
            assert value <= walked[rank], (candidate, rank)
        tight += max(floor) >= 0.9 * max(walked)
        checked += 1
    assert checked > 50 and tight > checked // 3


def test_shape_floor_is_below_every_split_and_not_vacuous() -> None:
    """floors.StateFloor.held, before partitioning, never exceeds held_floor of any split the
    partition methods make of the candidate, and comes close on the schedules that hold many
    micro-batches on every stage (GPipe, zero bubble)."""
    profile = small_profile(3, blocks=12, link=LinkProfile(2e8, 2e-5))
    problem = AutoProblem(profile=profile, ranks=4, topology=Topology.parse("2x1e9,2x1e8"),
                          methods=("uniform", "time", "parameters"), microbatches=(4, 8, 16),
                          memory_limit=1e12, shard=("none", "full"))
    shape_floor = StateFloor(problem)
    checked = tight = 0
    for candidate, _, plan, _ in completions(problem):
        floor, bound = held_floor(problem, plan), shape_floor.held(candidate)
        if not floor:
            assert bound == 0.0, candidate
            continue
        assert bound <= max(floor), candidate
        tight += bound >= 0.5 * max(floor) and candidate.schedule in ("gpipe", "zb-h2")
        checked += bound > 0
    assert checked > 50 and tight > 10


@pytest.mark.parametrize("seed", [5, 11])
def test_per_rank_shape_floor_is_below_every_split(seed: int) -> None:
    """The per-rank parts of StateFloor.held (the end blocks, the held counts per stage)
    stay below held_floor of every split the methods make, recomputing prefixes included,
    on a profile whose last block saves the most (a head's logits); and they prune: a
    recomputing candidate gets a floor from its last stage, and 1F1B's per-stage counts beat
    the mean on some candidate."""
    base = small_profile(seed, blocks=10, link=LinkProfile(2e8, 2e-5))
    head = replace(base.blocks[-1], activation_bytes=200e6)
    profile = replace(base, blocks=base.blocks[:-1] + (head,))
    problem = AutoProblem(profile=profile, ranks=4, topology=Topology.parse("2x1e9,2x1e8"),
                          methods=("uniform", "time", "parameters"), microbatches=(4, 8, 16),
                          memory_limit=1e12, recompute=(0, 1, 2, 8))
    shape_floor = StateFloor(problem)
    recomputing = per_stage_wins = 0
    for candidate, _, plan, _ in completions(problem, synchronous_only=True):
        floor, bound = held_floor(problem, plan), shape_floor.held(candidate)
        if not floor:
            assert bound == 0.0, candidate
            continue
        assert bound <= max(floor), (candidate, bound, max(floor))
        recomputing += candidate.recompute > 0 and bound > 0
        if candidate.schedule == "1f1b" and not candidate.recompute and candidate.shard == "none":
            scale = problem.batch // candidate.microbatches / profile.batch_size
            mean = (shape_floor.weights + shape_floor.state + scale * shape_floor.saved) \
                / candidate.depth  # 1F1B's last stage holds one micro-batch: c = 1
            per_stage_wins += bound > 1.01 * mean
    assert recomputing > 20 and per_stage_wins > 3
