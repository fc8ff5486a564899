"""``planner.block_columns``: a stage's sums over a profile's columns are, with ``==``, the
sums over its block records that ``plan_costs`` took before, on every span of random
profiles (measured and unknown ``W``/``I``, ints and floats), and ``plan_costs`` agrees."""

from __future__ import annotations

import random

from pipeweave.planner import block_columns as module
from pipeweave.planner.block_columns import block_columns
from pipeweave.planner.evaluate import Network, plan_costs
from pipeweave.planner.partition import uniform_partition
from pipeweave.profiler import BlockProfile, Profile


def random_profile(seed: int, blocks: int) -> Profile:
    rng = random.Random(seed)

    def value() -> float:
        return rng.choice([0.0, rng.uniform(1e-4, 1e-2), float(rng.randint(1, 3)) * 1e-3])

    return Profile(tuple(BlockProfile(
        name=f"b{i}", forward=rng.uniform(1e-4, 1e-2), backward=rng.uniform(2e-4, 2e-2),
        activation_bytes=rng.choice([rng.randint(1, 10**7), rng.uniform(1e3, 1e7)]),
        output_bytes=1e5, parameter_bytes=1e6, update=value(), weight_grad=value(),
        input_grad=value()) for i in range(blocks)))


def test_every_span_sums_as_the_block_records_do() -> None:
    for seed in range(6):
        profile = random_profile(seed, 23)
        column = block_columns(profile)
        blocks = profile.blocks
        for a in range(len(blocks)):
            for e in range(a + 1, len(blocks) + 1):
                part = blocks[a:e]
                assert sum(column.forward[a:e]) == sum(b.forward for b in part)
                assert sum(column.backward[a:e]) == sum(b.backward for b in part)
                assert sum(column.activation[a:e]) == sum(b.activation_bytes for b in part)
                assert sum(column.update[a:e]) == sum(b.update for b in part)
                assert sum(column.weight[a:e]) == sum(
                    b.weight_grad if b.weight_grad > 0 else b.backward / 2 for b in part)
                assert sum(column.input[a:e]) == sum(
                    b.input_grad if b.input_grad > 0 else
                    b.backward - (b.weight_grad if b.weight_grad > 0 else b.backward / 2)
                    for b in part)


def test_plan_costs_reads_the_columns_of_the_profile_it_is_given() -> None:
    profile = random_profile(7, 40)
    bounds = uniform_partition(40, 6)
    costs = plan_costs(profile, bounds, Network(bandwidth=1e9))
    blocks = profile.blocks
    assert costs.forward == tuple(sum(b.forward for b in blocks[a:e]) for a, e in bounds)
    assert costs.weight_grad == tuple(min(sum(b.weight_grad if b.weight_grad > 0 else
                                              b.backward / 2 for b in blocks[a:e]),
                                          sum(b.backward for b in blocks[a:e]))
                                      for a, e in bounds)
    other = random_profile(8, 40)  # another profile: its own columns, not the kept ones
    assert plan_costs(other, bounds).forward == tuple(
        sum(b.forward for b in other.blocks[a:e]) for a, e in bounds)


def test_columns_are_kept_per_profile_for_the_last_few() -> None:
    module._KEPT.clear()
    profiles = [random_profile(seed, 5) for seed in range(module.CACHE_SIZE + 3)]
    first = block_columns(profiles[0])
    assert block_columns(profiles[0]) is first
    for profile in profiles[1:]:
        block_columns(profile)
    assert len(module._KEPT) == module.CACHE_SIZE
    assert block_columns(profiles[0]) == first and block_columns(profiles[0]) is not first
