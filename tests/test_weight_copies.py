"""``memory.versions.weight_copies``'s one-pass answer for a flush (every update after its
stage's compute, nothing predicted) is the walks' answer: every registered schedule, lowered
or not, on many shapes; and the asynchronous ones still take the walks."""

from __future__ import annotations

import pytest

from pipeweave.ir import Schedule
from pipeweave.memory import versions
from pipeweave.schedules import Shape, available_schedules, build_schedule, lowered_schedule

NAMES = [info.name for info in available_schedules()]


def _walked(schedule: Schedule, keep_predicted: bool) -> list[int]:
    counts = versions.weight_versions(schedule, keep_predicted=keep_predicted)
    stashing = versions._stashes_live(schedule)
    return [v - 1 + (1 if s in stashing else 0) for s, v in enumerate(counts)]


def _shapes(name: str) -> list[Shape]:
    info = next(i for i in available_schedules() if i.name == name)
    chunks = info.default_chunks
    found = []
    for stages in (2, 3, 4):
        for microbatches in (stages, 2 * stages, 8):
            for iterations in (1, 2):
                shape = Shape(stages=stages, microbatches=microbatches, chunks=chunks,
                              iterations=iterations)
                try:
                    build_schedule(name, shape)
                except ValueError:
                    continue
                found.append(shape)
    return found


@pytest.mark.parametrize("name", NAMES)
def test_fast_copies_equal_the_walks(name: str) -> None:
    shapes = _shapes(name)
    assert shapes, name
    fast = 0
    for shape in shapes:
        for schedule in (build_schedule(name, shape), lowered_schedule(name, shape)):
            for keep in (False, True):
                assert versions.weight_copies(schedule, keep_predicted=keep) == \
                    _walked(schedule, keep), (name, shape)
            fast += versions._present_if_updates_last(schedule) is not None
    info = next(i for i in available_schedules() if i.name == name)
    if info.synchronous:  # one iteration of a flush takes the fast path
        assert fast > 0, name


def test_an_update_before_a_backward_takes_the_walk() -> None:
    schedule = build_schedule("pipedream", Shape(stages=3, microbatches=6, iterations=2))
    assert versions._present_if_updates_last(schedule) is None
    assert versions.weight_copies(schedule) == _walked(schedule, False)
    assert max(versions.weight_copies(schedule)) > 0
