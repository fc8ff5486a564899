"""Interleaved rounds: the one order in which the profiler times several things it will
compare (micro-batch sizes), so that a load that comes and goes while it measures slows them
alike.

A round runs every call once, in turn, the order reversed every other round (a call's
position in a round carries no advantage); the first ``warmup`` rounds are discarded; rounds
go on while ``more`` says so. Each call thus has as many results as the others, taken under
the same stretch of the machine's load. The block profiler (``measure._timed_runs``: one
block's forward and backward at each size) and the co-located slowdown
(``colocated.colocated_slowdowns``: whole steps at each size, alone and under load) both
time through :func:`interleaved_rounds`.

    round 0 (warm-up): a b c   round 1: c b a   round 2: a b c   round 3: c b a ...
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["interleaved_rounds"]

T = TypeVar("T")


def interleaved_rounds(calls: Sequence[Callable[[], T]], *, warmup: int,
                       more: Callable[[int, Sequence[Sequence[T]]], bool]) -> list[list[T]]:
    """Each call's results, round by round (module docstring): rounds run while
    ``more(rounds done, the results kept so far, one list per call)``."""
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0 rounds, got {warmup}")
    results: list[list[T]] = [[] for _ in calls]
    order = list(zip(results, calls))
    done = 0
    while more(done, results):
        for kept, call in (order if done % 2 == 0 else order[::-1]):
            result = call()
            if done >= warmup:
                kept.append(result)
        done += 1
    return results
