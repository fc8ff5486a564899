"""The min-max program's kept tables (planner/min_max_table.py) give the bounds a fresh run
gives, to the bit: for every stage count, every prefix, power-of-two scaled weights, and
weights the cache refuses."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pipeweave.planner import min_max_partition
from pipeweave.planner import min_max_table
from pipeweave.planner.partition import _min_max_program, stage_sums


def _fresh(weights: list[float], stages: int, end: int) -> tuple[tuple[int, int], ...]:
    return _min_max_program(np.asarray(weights[:end], dtype=float), stages, None)


@pytest.mark.parametrize("seed", range(6))
def test_kept_table_equals_a_fresh_run(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(20, 60)
    # ties on purpose: small integers and repeated values, where the first minimum matters
    weights = [rng.choice([float(rng.randint(0, 4)), rng.uniform(0.1, 3.0)]) for _ in range(n)]
    min_max_table._tables.clear()
    for stages in rng.sample(range(1, n + 1), min(n, 12)):  # grown out of order
        for end in sorted({stages, n, rng.randint(stages, n)}):
            bounds, heaviest = min_max_partition(weights, stages, end=end)
            assert bounds == _fresh(weights, stages, end)
            assert heaviest == max(stage_sums(weights, bounds))
            if end == n:  # the prefix form agrees with a sliced list
                assert min_max_partition(weights[:end], stages)[0] == bounds
    assert len(min_max_table._tables) == 1


@pytest.mark.parametrize("factor", [2.0 ** -3, 0.5, 4.0, 2.0 ** 20])
def test_power_of_two_scaled_weights_share_a_table(factor: float) -> None:
    rng = random.Random(7)
    weights = [rng.uniform(1e-4, 1e-2) for _ in range(80)]
    scaled = [w * factor for w in weights]
    min_max_table._tables.clear()
    for stages in (1, 2, 7, 31, 80):
        bounds, heaviest = min_max_partition(scaled, stages)
        assert bounds == _fresh(scaled, stages, len(scaled))
        assert heaviest == max(stage_sums(scaled, bounds))  # the caller's own numbers
        assert min_max_partition(weights, stages)[0] == bounds
    assert len(min_max_table._tables) == 1


def test_other_factors_and_refused_weights_stay_exact() -> None:
    rng = random.Random(3)
    weights = [rng.uniform(0.5, 2.0) for _ in range(40)]
    min_max_table._tables.clear()
    for stages in (3, 17):
        tripled = [3.0 * w for w in weights]  # not a power of two: its own table
        assert min_max_partition(tripled, stages)[0] == _fresh(tripled, stages, 40)
    assert len(min_max_table._tables) == 1
    for refused in ([1e-300, *weights], [-1.0, *weights], [float("inf"), *weights],
                    [0.0] * 40, [1e-200, 1e200]):
        assert min_max_table.table_for(refused) is None
        stages = min(5, len(refused))
        finite = all(np.isfinite(refused))
        if finite:
            assert min_max_partition(refused, stages)[0] == _fresh(refused, stages, len(refused))


def test_the_cache_is_bounded_and_the_end_checked() -> None:
    min_max_table._tables.clear()
    for i in range(min_max_table.CACHE_SIZE + 3):
        min_max_partition([1.0, 2.0, 3.0 + i, 1.0], 2)
    assert len(min_max_table._tables) == min_max_table.CACHE_SIZE
    with pytest.raises(ValueError, match="end 9 is outside the 4 blocks"):
        min_max_partition([1.0, 2.0, 3.0, 4.0], 2, end=9)
