"""The co-located slowdown of several micro-batch sizes timed interleaved (issue 29
follow-up): ``colocated_slowdowns`` times whole steps of every size round by round, alone
and then under load (``profiler.rounds.interleaved_rounds``, the block profiler's loop), so
a load that rises while they are timed slows every size alike and the sizes' slowdowns
agree. One size after the other (the old order: each size alone, then under its
neighbours), a rise during the first size's pair is charged to that size alone.

On the fake clock of ``tests/fake_clock.py`` with no neighbours (``ranks=1``), the true
slowdown of every size is 1; the load triples a quarter of the way through (within the
first size's pair in the old order)."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from fake_clock import Block, rising_load
from pipeweave.models import ModelSpec
from pipeweave.profiler import colocated
from pipeweave.profiler.colocated import colocated_slowdowns

SIZES = (1, 4)


def _spec() -> ModelSpec:
    torch.manual_seed(0)
    return ModelSpec(name="drift", blocks=tuple(Block() for _ in range(3)),
                     block_names=("a", "b", "c"), loss_fn=lambda out, y: out.sum())


def _batches() -> list[tuple[Tensor, Tensor | None]]:
    return [(torch.randn(m, 8), None) for m in SIZES]


def _interleaved() -> tuple[float, ...]:
    return colocated_slowdowns(_spec(), _batches(), ranks=1, batch_sizes=SIZES)


def _one_after_the_other() -> tuple[float, ...]:
    return tuple(colocated_slowdowns(_spec(), [batch], ranks=1, batch_sizes=(size,))[0]
                 for size, batch in zip(SIZES, _batches()))


@pytest.fixture
def fake_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """About 20 rounds per timed window on the fake clock (a round of both sizes: 34 units)."""
    monkeypatch.setattr(colocated, "STEP_SECONDS", 300.0)


@pytest.mark.usefixtures("fake_windows")
def test_sizes_timed_interleaved_slow_down_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    slowdowns = rising_load(monkeypatch, _interleaved, [colocated], at=0.25)
    assert len(slowdowns) == 2 and min(slowdowns) > 1.2  # the rise is seen, by both
    assert slowdowns[1] == pytest.approx(slowdowns[0], rel=0.1)


@pytest.mark.usefixtures("fake_windows")
def test_sizes_timed_one_after_the_other_do_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same rise against the old order (so the test above is not passing by accident)."""
    slowdowns = rising_load(monkeypatch, _one_after_the_other, [colocated], at=0.25)
    assert slowdowns[0] > 1.5 * slowdowns[1]


def test_one_size_is_the_one_element_case(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(colocated, "STEP_SECONDS", 0.01)  # the real clock: 4 rounds
    (slowdown,) = colocated_slowdowns(_spec(), _batches()[:1], ranks=1, batch_sizes=SIZES[:1])
    assert slowdown > 0
