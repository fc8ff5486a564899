"""auto/fill_bound.py: each declared window holds on the generated schedules, and the bound
stays below the simulated time of every split on random cost tables, equal to it on a
balanced split (the bound is tight)."""

from __future__ import annotations

import random

import pytest

from auto_fixtures import small_profile
from test_bounds import _simulated
from pipeweave.auto import AutoProblem, bounds
from pipeweave.auto.bounds import shape_bound
from pipeweave.auto.fill_bound import WINDOWS, fill_bound
from pipeweave.ir import Op, Schedule
from pipeweave.planner import Plan
from pipeweave.planner.topology import Topology
from pipeweave.profiler import LinkProfile
from pipeweave.schedules import build_schedule
from pipeweave.sim import Costs, simulate

GRADIENTS = (Op.BACKWARD,)


def _windows(schedule: Schedule, rank: int) -> tuple[int, int]:
    """``(k, j)`` of the rank's one stage, counted on its program (fill_bound's docstring)."""
    compute = [a for a in schedule.programs[rank] if a.op in (Op.FORWARD, *GRADIENTS)]
    first = next(i for i, a in enumerate(compute) if a.op in GRADIENTS)
    last = max(i for i, a in enumerate(compute) if a.op == Op.FORWARD)
    back = next(i for i, a in enumerate(compute)
                if a.op in GRADIENTS and a.microbatch == compute[last].microbatch)
    assert all(a.op in GRADIENTS for a in compute[last + 1:back])
    return first, back - last - 1


@pytest.mark.parametrize("name", sorted(WINDOWS))
def test_declared_windows_hold_on_the_generated_schedules(name: str) -> None:
    checked = 0
    for depth in range(1, 7):
        for microbatches in range(1, 13):
            plan = Plan.uniform(depth, depth, schedule=name, microbatches=microbatches)
            schedule = build_schedule(name, plan.shape(1))
            for stage in range(depth):
                k, j = _windows(schedule, stage)
                declared = WINDOWS[name](stage, depth, microbatches)
                assert k <= declared[0] and j <= declared[1], (depth, microbatches, stage)
                checked += 1
    assert checked > 200


def _costs(forward: list[float], backward: list[float], rng: random.Random) -> Costs:
    stages = len(forward)
    return Costs(forward=forward, backward=backward,
                 comm=[rng.uniform(0, 0.3) for _ in range(stages - 1)], latency=0.01,
                 update=[rng.uniform(0, 0.5) for _ in range(stages)])


@pytest.mark.parametrize("name", sorted(WINDOWS))
@pytest.mark.parametrize("seed", range(6))
def test_bound_is_below_every_split(name: str, seed: int) -> None:
    """Random blocks, every split of them into S stages (S up to 4), M up to 12: the
    simulated time is at least the bound of the blocks' total work and stage 0's update."""
    rng = random.Random(seed)
    blocks = 7
    block_f = [rng.uniform(0.2, 2) for _ in range(blocks)]
    block_b = [f * rng.uniform(0.5, 3) for f in block_f]
    total = sum(block_f) + sum(block_b)
    checked = binding = close = 0
    for depth in range(2, 5):
        for cuts in _splits(blocks, depth):
            forward = [sum(block_f[a:b]) for a, b in cuts]
            backward = [sum(block_b[a:b]) for a, b in cuts]
            costs = _costs(forward, backward, rng)
            for microbatches in (depth + 1, 2 * depth, 12):
                plan = Plan.uniform(depth, depth, schedule=name, microbatches=microbatches)
                time = simulate(build_schedule(name, plan.shape(1)), costs).iteration_time
                bound = fill_bound(name, depth, microbatches, total) + costs.update[0]
                assert bound <= time * (1 + 1e-9), (cuts, microbatches, bound, time)
                # above the busiest stage's own work on this very split: the fill counted
                binding += bound > microbatches * max(f + b for f, b in zip(forward, backward))
                close += bound >= 0.75 * time
                checked += 1
    assert checked > 100 and binding >= 10 and close >= 20


def _splits(blocks: int, stages: int) -> list[list[tuple[int, int]]]:
    """Every split of ``blocks`` blocks into ``stages`` non-empty contiguous stages."""
    if stages == 1:
        return [[(0, blocks)]]
    out = []
    for first in range(1, blocks - stages + 2):
        out += [[(0, first)] + [(a + first, b + first) for a, b in rest]
                for rest in _splits(blocks - first, stages - 1)]
    return out


@pytest.mark.parametrize("depth,microbatches", [(2, 3), (4, 5), (4, 16), (8, 9), (8, 40)])
def test_bound_is_the_balanced_time(depth: int, microbatches: int) -> None:
    """Equal stages, no messages: 1F1B takes (n + S - 1)(f + b), and so does the bound."""
    costs = Costs(forward=[1.0] * depth, backward=[2.0] * depth)
    plan = Plan.uniform(depth, depth, schedule="1f1b", microbatches=microbatches)
    time = simulate(build_schedule("1f1b", plan.shape(1)), costs).iteration_time
    bound = fill_bound("1f1b", depth, microbatches, 3.0 * depth)
    assert bound == pytest.approx(time, rel=1e-9)
    assert bound == pytest.approx((microbatches + depth - 1) * 3.0, rel=1e-9)


def test_no_bound_without_declared_windows() -> None:
    assert fill_bound("zb-h2", 4, 16, 10.0) == 0.0
    assert fill_bound("1f1b", 4, 1, 10.0) == 0.0


@pytest.mark.parametrize("shared_cores", [None, 3])
def test_shape_bound_with_the_fill_is_below_every_candidate(
        shared_cores: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """In shape_bound (per copy ``ceil(M / w)`` micro-batches, recomputation, block 0's
    all-reduce and update closing the chain): below the simulated time of every candidate
    the partition methods make, and above the bound without it on many (M = 16: ``n >= S``
    on two or four stages)."""
    profile = small_profile(4, blocks=32, link=LinkProfile(1e11, 1e-6))  # the fill dominates
    problem = AutoProblem(profile=profile, ranks=8, topology=Topology.parse("2x1e11,4x1e10"),
                          shared_cores=shared_cores, schedules=tuple(sorted(WINDOWS)),
                          methods=("uniform", "time", "parameters"), microbatches=(8, 16, 48),
                          recompute=(0, 1, 2, 32))
    link = 1e11
    checked = raised = 0
    for candidate, _, scaled, _, time in _simulated(problem):
        with_fill = shape_bound(candidate, scaled, problem, link)
        assert with_fill <= time * (1 + 1e-9), (candidate, with_fill, time)
        with monkeypatch.context() as patch:
            patch.setattr(bounds, "fill_bound", lambda *args: 0.0)
            without = shape_bound(candidate, scaled, problem, link)
            raised += with_fill > 1.01 * without
        checked += 1
    # three cores for eight ranks: the compute over the cores binds instead
    assert checked > 100 and (shared_cores is not None or raised > checked // 5), raised
