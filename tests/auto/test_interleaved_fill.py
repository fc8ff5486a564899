"""auto/interleaved_fill.py: the declared first backward of each rank matches Megatron's
generated order, and the bound stays below the simulated time on random costs, close enough
that a 5 % inflation fails; through plan_bound, below every candidate the methods make."""

from __future__ import annotations

import random

import pytest

from auto_fixtures import small_profile
from test_bounds import _simulated
from pipeweave.auto import AutoProblem
from pipeweave.auto.bounds import plan_bound
from pipeweave.auto.interleaved_fill import first_backward, interleaved_fill_bound
from pipeweave.ir import Op
from pipeweave.planner import Plan
from pipeweave.profiler import LinkProfile
from pipeweave.schedules import build_schedule
from pipeweave.schedules.interleaved import interleaved_order
from pipeweave.sim import Costs, simulate


@pytest.mark.parametrize("ranks,chunks", [(2, 2), (3, 2), (4, 2), (2, 3), (4, 3), (5, 2)])
def test_first_backward_matches_the_order(ranks: int, chunks: int) -> None:
    for n in (ranks, 2 * ranks, 3 * ranks, 5 * ranks):
        for rank in range(ranks):
            order = interleaved_order(rank, ranks, chunks, list(range(n)))
            first = next(i for i, (op, _, _) in enumerate(order) if op == Op.BACKWARD)
            stage, counts = first_backward(rank, ranks, chunks, n)
            assert (order[first][1], order[first][2]) == (stage, 0)
            ran = [sum(1 for op, s, _ in order[:first] if op == Op.FORWARD and s // ranks == c)
                   for c in range(chunks)]
            assert list(counts) == ran, (rank, n)
            last = order[-1]
            assert last[0] == Op.BACKWARD and last[1] == rank  # chunk 0 ends the rank


def _costs(stages: int, rng: random.Random) -> Costs:
    forward = [rng.uniform(0.2, 2) for _ in range(stages)]
    return Costs(forward=forward, backward=[f * rng.uniform(0.5, 3) for f in forward],
                 comm=[rng.uniform(0, 0.3) for _ in range(stages - 1)], latency=0.01,
                 update=[rng.uniform(0, 0.5) for _ in range(stages)],
                 all_reduce=[rng.uniform(0, 2) for _ in range(stages)])


@pytest.mark.parametrize("seed", range(4))
def test_bound_is_below_the_simulated_time(seed: int) -> None:
    """Random stage costs, 2 to 4 ranks, 2 or 3 chunks, n = P to 4P micro-batches, width 1
    or 2: the bound never exceeds the simulated time, and often comes within 5 %."""
    rng = random.Random(seed)
    checked = close = 0
    for depth in (2, 3, 4):
        for chunks in (2, 3):
            for width in (1, 2):
                for per_copy in (depth, 2 * depth, 4 * depth):
                    stages = depth * chunks
                    plan = Plan.uniform(stages, depth, chunks=chunks, width=width,
                                        schedule="interleaved-1f1b",
                                        microbatches=per_copy * width)
                    costs = _costs(stages, rng)
                    time = simulate(build_schedule("interleaved-1f1b", plan.shape(1)),
                                    costs).iteration_time
                    bound = interleaved_fill_bound(plan, costs.resolve(stages))
                    assert 0 < bound <= time * (1 + 1e-9), (depth, chunks, per_copy, bound, time)
                    close += bound * 1.05 > time
                    checked += 1
    assert checked == 36 and close >= 3, close


def test_balanced_costs_give_the_interleaved_bubble() -> None:
    """Equal stages, no messages or updates: the last rank's chain is Megatron's time,
    ``(n v + 2 (P - 1) ... )`` as simulated, to rounding."""
    for depth, chunks, n in ((4, 2, 8), (4, 2, 4), (8, 2, 16), (4, 3, 12)):
        stages = depth * chunks
        plan = Plan.uniform(stages, depth, chunks=chunks, schedule="interleaved-1f1b",
                            microbatches=n)
        costs = Costs(forward=[1.0] * stages, backward=[2.0] * stages)
        time = simulate(build_schedule("interleaved-1f1b", plan.shape(1)), costs).iteration_time
        bound = interleaved_fill_bound(plan, costs.resolve(stages))
        assert time * 0.95 < bound <= time * (1 + 1e-9), (depth, chunks, n, bound, time)


def test_no_bound_where_the_order_differs() -> None:
    costs = Costs(forward=[1.0] * 4, backward=[2.0] * 4).resolve(4)
    assert interleaved_fill_bound(Plan.uniform(4, 4, schedule="1f1b", microbatches=8),
                                  costs) == 0.0
    assert interleaved_fill_bound(Plan.uniform(4, 2, chunks=2, schedule="interleaved-zb",
                                               microbatches=8), costs) == 0.0


def test_plan_bound_with_it_is_below_every_candidate() -> None:
    """Every interleaved candidate the partition methods make (recomputing prefixes, width,
    a link): plan_bound stays below its simulated time, and the interleaved chain raises it
    on some."""
    profile = small_profile(6, blocks=16, link=LinkProfile(1e9, 1e-5))
    problem = AutoProblem(profile=profile, ranks=4, schedules=("interleaved-1f1b",),
                          methods=("uniform", "time", "parameters"), microbatches=(4, 8, 16),
                          recompute=(0, 1, 4, 16))
    checked = raised = 0
    for _, plan, _, costs, time in _simulated(problem):
        bound = plan_bound(plan, costs, problem)
        assert bound <= time * (1 + 1e-9), (plan, bound, time)
        table = costs.resolve(len(plan.stages))
        raised += interleaved_fill_bound(plan, table) >= bound * (1 - 1e-12) > 0
        checked += 1
    assert checked > 20 and raised > checked // 4, (checked, raised)
