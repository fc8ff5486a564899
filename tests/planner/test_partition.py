"""Equal-count and min-max (Algorithm 1) partitions: brute-force optimality and edge cases."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from pipeweave.planner import min_max_partition, uniform_partition
from pipeweave.planner.partition import stage_sums


def all_partitions(n: int, p: int) -> list[tuple[tuple[int, int], ...]]:
    out = []
    for cuts in itertools.combinations(range(1, n), p - 1):
        ends = (0, *cuts, n)
        out.append(tuple(zip(ends, ends[1:])))
    return out


@pytest.mark.parametrize("seed", range(25))
def test_min_max_equals_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 9)
    p = rng.randint(1, n)
    weights = [rng.choice([0.0, rng.uniform(0, 10), float(rng.randint(1, 4))]) for _ in range(n)]
    bounds, heaviest = min_max_partition(weights, p)
    best = min(max(stage_sums(weights, b)) for b in all_partitions(n, p))
    assert heaviest == pytest.approx(best, rel=1e-12, abs=1e-12)
    assert len(bounds) == p and bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(a < e for a, e in bounds) and all(x[1] == y[0] for x, y in zip(bounds, bounds[1:]))
    assert max(stage_sums(weights, bounds)) == heaviest


def test_literal_small_case() -> None:
    # 1 2 3 4 5 into 3 stages: [1 2 3] [4] [5] has max 6; nothing does better
    assert min_max_partition([1, 2, 3, 4, 5], 3) == (((0, 3), (3, 4), (4, 5)), 6.0)
    # ties keep the first minimum (smallest previous boundary): later stages grow
    assert min_max_partition([1, 1, 1, 1], 2)[0] == ((0, 2), (2, 4))


def test_memory_mask_constrains_the_stages() -> None:
    weights = [1.0, 1.0, 1.0, 1.0]
    # no stage may hold blocks 0 and 1 together: [0,2) is forbidden for every stage
    def feasible(_stage: int) -> np.ndarray:
        mask = np.ones((5, 5), dtype=bool)
        mask[0, 2] = False
        return mask
    bounds, heaviest = min_max_partition(weights, 2, feasible=feasible)
    assert bounds == ((0, 1), (1, 4)) and heaviest == 3.0
    with pytest.raises(ValueError, match="no partition of 4 blocks into 2 stages satisfies"):
        min_max_partition(weights, 2, feasible=lambda _s: np.zeros((5, 5), dtype=bool))


def test_uniform_partition() -> None:
    assert uniform_partition(10, 4) == ((0, 3), (3, 6), (6, 8), (8, 10))
    assert uniform_partition(3, 3) == ((0, 1), (1, 2), (2, 3))


@pytest.mark.parametrize("call", [lambda: uniform_partition(3, 4), lambda: min_max_partition([1.0] * 3, 4)])
def test_more_stages_than_blocks(call: object) -> None:
    with pytest.raises(ValueError, match="cannot split 3 blocks into 4 stages: every stage needs at "
                                         "least one block; use at most 3 stages"):
        call()  # type: ignore[operator]


def test_algorithm_1_partitions_1000_blocks_on_64_stages() -> None:
    # Its speed is the planning benchmark's job (benchmarks/planning_time.py); this checks the
    # large case is whole and optimal by the lower bounds a min-max split has.
    rng = random.Random(1)
    weights = [rng.uniform(0.5, 2.0) for _ in range(1000)]
    bounds, heaviest = min_max_partition(weights, 64)
    assert len(bounds) == 64 and bounds[0][0] == 0 and bounds[-1][1] == 1000
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert heaviest >= max(sum(weights) / 64, max(weights))
    assert heaviest == pytest.approx(max(sum(weights[i:j]) for i, j in bounds))
