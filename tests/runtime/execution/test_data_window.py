"""The data window a rank keeps is what its program needs (issue 24): not a fixed 16 batches."""

from __future__ import annotations

import pytest
import torch

from pipeweave.ir import parse_action
from pipeweave.runtime.execution.microbatches import MicrobatchSource, data_window
from pipeweave.runtime.execution.parts import make_schedule
from pipeweave.runtime import Plan


def program(text: str) -> list:  # type: ignore[type-arg]
    return [parse_action(a) for a in text.split()]


def test_one_batch_at_a_time_keeps_one() -> None:
    # M = 2: micro-batches 0, 1 are batch 0; 2, 3 batch 1
    assert data_window(program("0F0 0F1 0B0 0B1 0U 0F2 0F3 0B2 0B3 0U"), microbatches=2) == 1


def test_a_forward_ahead_of_an_older_backward_keeps_both() -> None:
    # the forward of batch 1 runs before the backward of batch 0 (PipeDream's steady state)
    assert data_window(program("0F0 0F1 0F2 0B0 0B1 0F3 0B2 0B3"), microbatches=2) == 2


def test_parallel_pipelines_take_consecutive_batches() -> None:
    # N = 2 pipelines: iteration 0 reads batches 0 (#0) and 1 (#1)
    assert data_window(program("0F0 0F0#1 0B0 0B0#1"), microbatches=1, pipelines=2) == 2


@pytest.mark.parametrize("schedule,expected", [("1f1b", 1), ("pipedream", 2)])
def test_real_schedules(schedule: str, expected: int) -> None:
    plan = Plan.uniform(4, 2, schedule=schedule, microbatches=4)
    first = make_schedule(plan, 6).programs[0]
    assert data_window(first, microbatches=4) == expected


def test_a_batch_dropped_from_the_window_is_an_error_not_a_silent_reread() -> None:
    stream = ((torch.full((2, 1), float(k)), torch.zeros(2)) for k in range(10))
    source = MicrobatchSource(stream, microbatches=2, window=1)
    assert source.inputs(2).item() == 1.0  # batch 1 drawn, batch 0 dropped
    with pytest.raises(RuntimeError, match="window of 1"):
        source.inputs(0)
