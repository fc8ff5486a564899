"""A fake clock for the profiler's timing loops (issue 29): blocks whose forward (backward)
advances it by ``load x (FIXED + PER_SAMPLE m)`` (twice that) for ``m`` samples, the load
rising from 1 to ``RISE`` at a set time. :func:`rising_load` runs a profiling once on a flat
load to learn its length, then again with the load rising partway (halfway by default), so a test can tell an
order of timed runs that keeps the sizes' ratio (interleaved) from one that loses it (one
size after the other)."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
import torch
from torch import Tensor, nn

__all__ = ["FIXED", "PER_SAMPLE", "RISE", "Clock", "Work", "Block", "true_ratio",
           "rising_load"]

FIXED, PER_SAMPLE, RISE = 1.0, 0.25, 3.0
"""A call's cost ``FIXED + PER_SAMPLE m`` (forward; the backward twice it), times the load,
which is 1 until the clock reaches the halfway time and ``RISE`` after."""

T = TypeVar("T")


def true_ratio(small: int, large: int) -> float:
    """The cost model's time at ``large`` samples over that at ``small``."""
    return (FIXED + PER_SAMPLE * large) / (FIXED + PER_SAMPLE * small)


class Clock:
    """``perf_counter`` for the profiler: moves only when a block works."""

    def __init__(self, rise_at: float) -> None:
        self.now = 0.0
        self.rise_at = rise_at

    def perf_counter(self) -> float:
        return self.now

    def work(self, samples: int, weight: float) -> None:
        load = 1.0 if self.now < self.rise_at else RISE
        self.now += load * weight * (FIXED + PER_SAMPLE * samples)


class Work(torch.autograd.Function):
    clock = Clock(rise_at=float("inf"))

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        Work.clock.work(x.shape[0], 1.0)
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        Work.clock.work(grad.shape[0], 2.0)
        return grad


class Block(nn.Module):
    def __init__(self, features: int = 8) -> None:
        super().__init__()
        self.linear = nn.Linear(features, features)

    def forward(self, x: Tensor) -> Tensor:
        return Work.apply(self.linear(x))  # type: ignore[no-any-return]


def rising_load(monkeypatch: pytest.MonkeyPatch, how: Callable[[], T],
                timed: list[Any], at: float = 0.5) -> T:
    """``how()`` on the fake clock (``timed``: the modules whose ``time.perf_counter`` it
    replaces), the load rising ``at`` (a fraction) through its own flat-load run."""
    clock = Clock(rise_at=float("inf"))
    monkeypatch.setattr(Work, "clock", clock)
    for module in timed:
        monkeypatch.setattr(module, "time", types.SimpleNamespace(
            perf_counter=clock.perf_counter))
    how()
    clock.rise_at, clock.now = clock.now * at, 0.0
    result = how()
    assert clock.now > clock.rise_at  # the load did rise while profiling
    return result
