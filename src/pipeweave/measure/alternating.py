"""Plans timed in alternating rounds: each round runs every plan once (A, B, A, B, ...), each
run lasts about ``seconds`` of timed iterations (the warm-up iteration left out), and a plan's
time is the median of its rounds' medians.

Why: on this 2-core machine a run's iterations move 10-30 % with what else runs; six steps
of one run each (``auto --run`` before) gave a winner 1.06x, 1.14x and 1.27x the default in
three runs of the same command. Alternating puts both plans under the same load drift, the
time-based step count gives a 10-ms model a hundred timed iterations and a 1-s model a few,
and the spread between rounds says how far to trust the median.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..planner.plan import Plan

__all__ = ["Rounds", "RUN_ROUNDS", "TIMED_SECONDS", "alternate", "round_steps", "timed_steps"]

TIMED_SECONDS = 1.0
"""How long the timed iterations of one run last at least, in the calibration and in each
round of ``auto --run`` (``--run-seconds``): a median of a handful of 10-millisecond
iterations (cnn) moves by half from one run to the next."""

RUN_ROUNDS = 3
"""Rounds ``auto --run`` alternates by default (each about :data:`TIMED_SECONDS` of timed
iterations)."""


def timed_steps(predicted: float, *, least: int = 6, most: int = 200,
                seconds: float = TIMED_SECONDS) -> int:
    """Steps for a run whose iterations (the first is warm-up) last about ``seconds``
    (``TIMED_SECONDS``) together, given a predicted iteration time."""
    wanted = math.ceil(seconds / predicted) + 1 if predicted > 0 else least
    return max(least, min(most, wanted))


@dataclass(frozen=True)
class Rounds:
    """One plan's per-round seconds per iteration."""

    times: tuple[float, ...]
    steps: int

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def spread(self) -> float:
        """``(slowest - fastest) / median`` of the rounds (0 for one round)."""
        return (max(self.times) - min(self.times)) / self.median if self.median > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"rounds": list(self.times), "steps_per_round": self.steps,
                "median": self.median, "spread": self.spread}


def round_steps(predicted: float, *, seconds: float, steps: int | None) -> int:
    """Steps of one run: ``steps`` when given, else about ``seconds`` of timed iterations at
    the ``predicted`` iteration time (at least 6, at most 400)."""
    if steps is not None:
        return steps
    return timed_steps(predicted, seconds=seconds, most=400)


def alternate(plans: Mapping[str, tuple[Plan, float]], *, rounds: int, seconds: float,
              steps: int | None, time_one: Callable[[str, Plan, int], float],
              say: Callable[[str], None] | None = None) -> dict[str, Rounds]:
    """Per label of ``plans`` (``label -> (plan, predicted seconds per iteration)``), its
    rounds (module docstring); ``time_one(label, plan, steps)`` -> measured seconds per
    iteration of one run."""
    if rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {rounds}")
    counts = {label: round_steps(predicted, seconds=seconds, steps=steps)
              for label, (_, predicted) in plans.items()}
    times: dict[str, list[float]] = {label: [] for label in plans}
    for index in range(rounds):
        for label, (plan, _) in _order(plans, index):
            if say is not None:
                say(f"round {index + 1}/{rounds}: {label} ({plan.schedule}), "
                    f"{counts[label]} steps ...")
            times[label].append(time_one(label, plan, counts[label]))
    return {label: Rounds(tuple(values), counts[label]) for label, values in times.items()}


def _order(plans: Mapping[str, tuple[Plan, float]],
           index: int) -> Sequence[tuple[str, tuple[Plan, float]]]:
    """The plans in the order round ``index`` runs them: A, B in even rounds, B, A in odd
    ones, so that neither always runs first (after a fresh process start, a warm cache)."""
    items = list(plans.items())
    return items if index % 2 == 0 else items[::-1]


Timer = Callable[[str, Plan, int], tuple[float, Sequence[float]]]
"""``(label, plan, steps) -> (seconds per iteration, per rank compute seconds per iteration)``
of one run (:func:`~.plan_run.plan_timer`)."""


@dataclass(frozen=True)
class TimedRounds:
    """Plans timed in alternating rounds: per label its rounds, its compute per round (summed
    over ranks) and its rank count."""

    rounds: dict[str, Rounds]
    compute: dict[str, list[float]]
    ranks: dict[str, int]


def time_rounds(plans: Mapping[str, tuple[Plan, float]], timers: Mapping[str, Timer], *,
                rounds: int, seconds: float, steps: int | None,
                say: Callable[[str], None] | None = None) -> TimedRounds:
    """``plans`` (label -> plan, predicted seconds per iteration) timed in alternating rounds
    (:func:`alternate`), each through its label's timer."""
    compute: dict[str, list[float]] = {label: [] for label in plans}
    ranks: dict[str, int] = {}

    def time_one(label: str, plan: Plan, count: int) -> float:
        seconds_per_iteration, per_rank = timers[label](label, plan, count)
        compute[label].append(float(sum(per_rank)))
        ranks[label] = len(per_rank)
        return seconds_per_iteration

    timed = alternate(plans, rounds=rounds, seconds=seconds, steps=steps, time_one=time_one,
                      say=say)
    return TimedRounds(timed, compute, ranks)
