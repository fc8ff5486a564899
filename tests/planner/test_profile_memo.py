"""Kept per-stage bytes (planner/profile_memo.py) and kept layouts (schedules.Shape.layout):
the same numbers and layouts as computed afresh, per profile and split, never another's."""

from __future__ import annotations

import gc
import random
from dataclasses import replace

from pipeweave.ir import Layout
from pipeweave.planner import Plan
from pipeweave.planner import profile_memo
from pipeweave.planner.memory import _optimizer_state, optimizer_state_bytes, stage_weights
from pipeweave.planner.partition import uniform_partition
from pipeweave.schedules import Shape

from planner_fixtures import random_profile


def _plan(blocks: int, stages: int, schedule: str = "1f1b") -> Plan:
    return Plan(num_blocks=blocks, stages=uniform_partition(blocks, stages), schedule=schedule,
                microbatches=stages)


def _fresh_weights(profile, plan):  # type: ignore[no-untyped-def]
    return [(profile.stage_parameter_bytes(a, e),
             max(b.parameter_bytes for b in profile.blocks[a:e])) for a, e in plan.stages]


def test_kept_stage_bytes_equal_fresh_ones_per_profile_and_split() -> None:
    rng = random.Random(5)
    profiles = [random_profile(rng, 30) for _ in range(3)]
    for _ in range(2):  # the second round is answered from the memo
        for profile in profiles:
            for stages in (1, 4, 7):
                plan = _plan(30, stages)
                weights = stage_weights(profile, plan)
                assert [(w.parameters, w.largest_block) for w in weights] == \
                    _fresh_weights(profile, plan)
                for optimizer in (None, "adam", "sgd"):
                    assert optimizer_state_bytes(profile, plan, optimizer) == \
                        _optimizer_state(profile, plan.stages, optimizer)


def test_answers_are_copies_and_dead_profiles_are_not_reused() -> None:
    rng = random.Random(9)
    profile = random_profile(rng, 12)
    plan = _plan(12, 3)
    first = optimizer_state_bytes(profile, plan, "adam")
    first[0] = -1.0  # the caller's list: the memo keeps its own
    assert optimizer_state_bytes(profile, plan, "adam")[0] >= 0.0
    doubled = replace(profile, blocks=tuple(replace(b, parameter_bytes=2 * b.parameter_bytes,
                                                    optimizer_bytes=2 * b.optimizer_bytes)
                                            for b in profile.blocks))
    assert [w.parameters for w in stage_weights(doubled, plan)] == \
        [2 * w.parameters for w in stage_weights(profile, plan)]
    del profile
    gc.collect()
    for _ in range(50):  # new profiles, perhaps at the dead one's address: their own numbers
        other = random_profile(rng, 12)
        assert [w.parameters for w in stage_weights(other, plan)] == \
            [a for a, _ in _fresh_weights(other, plan)]
    assert len(profile_memo._kept) <= profile_memo.CACHE_SIZE


def test_kept_layouts_equal_fresh_ones() -> None:
    cases = [(Shape(stages=4, microbatches=8), "loop", Layout.data_parallel(4, 1, 1)),
             (Shape(stages=4, microbatches=8, width=3, chunks=2), "loop",
              Layout.data_parallel(4, 3, 2)),
             (Shape(stages=3, microbatches=6, chunks=2, width=2), "v", Layout.v_shape(3, 2)),
             (Shape(stages=3, microbatches=6, replicas=(1, 2, 1)), "loop",
              Layout.replicated((1, 2, 1)))]
    for shape, placement, fresh in cases:
        assert shape.layout(placement) == fresh
        again = replace(shape, microbatches=2 * shape.microbatches, options={"x": 1})
        assert again.layout(placement) is shape.layout(placement)  # one object, kept
