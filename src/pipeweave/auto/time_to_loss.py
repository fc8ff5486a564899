"""Ranking by predicted time to a target loss (``pipeweave auto --semantics any``).

A faster schedule that learns less per sample can lose on the clock (docs/convergence.md). So
under ``--semantics any`` the finalists get a short pilot each (the measurement layer trains
their plans in one process on the same sample stream, :mod:`pipeweave.measure.pilot`); from
the pilot's training losses against samples seen, a least-squares line gives the loss per
sample (the slope). With the common start ``L0`` (1F1B's line at 0 samples: every plan starts
from the same weights) and the target ``T`` (given, or 1F1B's line after its pilot)::

    predicted samples to T  =  (L0 - T) / -slope            (never, when slope >= 0)
    predicted seconds to T  =  predicted samples / predicted samples per second

A plan whose training is ``exact`` makes the same updates as 1F1B (docs/auto.md), so it takes
1F1B's slope without a pilot of its own. Pure arithmetic: no torch here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .predict import Prediction

__all__ = ["PilotCurve", "TimeToLoss", "TimeToLossRanking", "fit_line", "rank_by_time_to_loss"]


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``(intercept, slope)`` of ``ys`` against ``xs`` (two points or more)."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError(f"a line needs two points or more, one y per x; got {len(xs)} x and "
                         f"{len(ys)} y: run the pilot for --steps 2 or more")
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread
    return mean_y - slope * mean_x, slope


@dataclass(frozen=True)
class PilotCurve:
    """A pilot's training loss per iteration, and the samples each iteration consumed."""

    losses: tuple[float, ...]
    samples_per_iteration: int

    @property
    def samples(self) -> list[float]:
        """Samples seen when each iteration's loss was taken (its batch included)."""
        return [float((i + 1) * self.samples_per_iteration) for i in range(len(self.losses))]

    def line(self) -> tuple[float, float]:
        """``(loss at 0 samples, loss per sample)``; a non-finite loss makes the slope +inf
        (the pilot diverged: it never reaches a target)."""
        if not all(math.isfinite(v) for v in self.losses):
            return math.inf, math.inf
        return fit_line(self.samples, self.losses)


@dataclass(frozen=True)
class TimeToLoss:
    """One finalist's predicted time to the target."""

    prediction: Prediction
    slope: float
    """Loss per sample from its pilot (1F1B's for an exact plan); negative: it learns."""
    relative_slope: float
    """``slope`` / 1F1B's: 1.0 learns as fast per sample as 1F1B, 0 or below never arrives."""
    samples: float | None
    """Predicted samples to the target (None: never)."""
    seconds: float | None
    """Predicted seconds to the target (None: never)."""
    piloted: bool
    """It ran a pilot of its own (False: an exact plan, 1F1B's slope)."""


@dataclass(frozen=True)
class TimeToLossRanking:
    """The finalists best first by predicted time to ``target``, and what it was computed from."""

    target: float
    start: float
    """The common start ``L0``: 1F1B's line at 0 samples."""
    baseline_slope: float
    steps: int
    """Iterations of each pilot."""
    rows: tuple[TimeToLoss, ...]


def rank_by_time_to_loss(finalists: Sequence[tuple[Prediction, PilotCurve | None]], *,
                         baseline: PilotCurve, target: float | None) -> TimeToLossRanking:
    """The finalists (each with its pilot, or None for an exact plan) ranked by predicted
    seconds to ``target`` (None: 1F1B's line after its pilot), never-arriving ones last in
    their given order."""
    start, base_slope = baseline.line()
    if not (math.isfinite(start) and base_slope < 0):
        raise ValueError(f"1F1B's pilot did not learn (loss per sample {base_slope:.3g}): no "
                         f"target to rank by; run more --steps or pass --target-loss")
    goal = start + base_slope * baseline.samples[-1] if target is None else target
    rows = []
    for prediction, pilot in finalists:
        slope = base_slope if pilot is None else pilot.line()[1]
        samples = (0.0 if start <= goal else
                   (start - goal) / -slope if slope < 0 else None)
        seconds = None if samples is None else samples / prediction.samples_per_second
        rows.append(TimeToLoss(prediction, slope, slope / base_slope, samples, seconds,
                               piloted=pilot is not None))
    ordered = sorted(rows, key=lambda r: math.inf if r.seconds is None else r.seconds)
    return TimeToLossRanking(target=goal, start=start, baseline_slope=base_slope,
                             steps=len(baseline.losses), rows=tuple(ordered))
