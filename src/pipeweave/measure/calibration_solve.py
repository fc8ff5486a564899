"""Parameters at which simulated plans time as measured: the solver of the calibration
(:mod:`.calibration_runs`).

Each :class:`Target` is a measured value, the parameter that mainly moves it and the model's
prediction at any parameters. First Gauss-Seidel: each parameter in turn by bisection on its
own target, the others held, repeated (``passes``). Where plans depend on several parameters
at once (ranks sharing cores: a plan's compute stretches with what runs beside it, the
default plan's 64 actions move with the per-action cost) that converges slowly, so Newton's
method then finishes it: the targets' differences from their measurements, a Jacobian by
forward differences, a linear step, each parameter kept at or above its least value (one
held there drops out of the step). The simulated times are piecewise linear in the
parameters, so a step inside one piece lands on the solution.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Target", "solve"]


@dataclass(frozen=True)
class Target:
    """A measured time that a parameter must make the model predict."""

    parameter: str
    predict: Callable[[Mapping[str, float]], float]
    measured: float
    least: float = 0.0
    """The parameter's smallest value (1 for a scale, 0 for a cost)."""


def _bisect(predicted: Callable[[float], float], measured: float, least: float = 0.0) -> float:
    """The least value of a parameter, from ``least`` (to 40 halvings), at which
    ``predicted`` (not decreasing in it) reaches ``measured``; ``least`` when no value up to
    a minute (60 over ``least``) does (no such cost on the critical path)."""
    low, high = least, least + 1e-3
    reached = predicted(high) >= measured
    while not reached and high < least + 60.0:
        low, high = high, least + (high - least) * 4
        reached = predicted(high) >= measured
    if not reached:
        return least
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if predicted(middle) < measured else (low, middle)
    return high


def solve(targets: Sequence[Target], *, fixed: Mapping[str, float] | None = None,
          passes: int = 12, steps: int = 20) -> dict[str, float]:
    """The parameters (each >= its ``least``) at which every target's prediction equals its
    measured value (module docstring), the ``fixed`` ones held; a parameter whose target is
    below the prediction at its least value stays there."""
    theta = {**dict(fixed or {}), **{t.parameter: t.least for t in targets}}
    for _ in range(passes):
        moved = False
        for target in targets:
            def probe(value: float, name: str = target.parameter,
                      predict: Callable[[Mapping[str, float]], float] = target.predict
                      ) -> float:
                return predict({**theta, name: value})

            least = target.least
            value = least if probe(least) >= target.measured else \
                _bisect(probe, target.measured, least)
            moved = moved or abs(value - theta[target.parameter]) > 1e-12 + 1e-9 * value
            theta[target.parameter] = value
        if not moved:
            break
    return _newton(targets, theta, steps=steps)


def _close(target: Target, value: float) -> bool:
    return abs(value - target.measured) <= 1e-13 + 1e-10 * abs(target.measured)


def _newton(targets: Sequence[Target], theta: dict[str, float], *,
            steps: int) -> dict[str, float]:
    """``theta`` refined by projected Newton steps (module docstring) until every target
    is met or held, or no step helps."""
    for _ in range(steps):
        misses = [t.predict(theta) - t.measured for t in targets]
        if all(_close(t, m + t.measured) for t, m in zip(targets, misses)):
            break
        jacobian = _jacobian(targets, theta, misses)
        trial = _projected_step(targets, theta, jacobian, misses)
        if trial is None or sum(abs(t.predict(trial) - t.measured) for t in targets) \
                >= sum(map(abs, misses)):
            break
        theta = trial
    return theta


def _jacobian(targets: Sequence[Target], theta: Mapping[str, float],
              misses: Sequence[float]) -> np.ndarray:
    """``d (prediction_i - measured_i) / d parameter_j`` by forward differences."""
    out = np.empty((len(targets), len(targets)))
    for j, column in enumerate(targets):
        h = 1e-7 + 1e-4 * abs(theta[column.parameter])
        moved = {**theta, column.parameter: theta[column.parameter] + h}
        for i, row in enumerate(targets):
            out[i, j] = (row.predict(moved) - row.measured - misses[i]) / h
    return out


def _projected_step(targets: Sequence[Target], theta: Mapping[str, float],
                    jacobian: np.ndarray, misses: Sequence[float]) -> dict[str, float] | None:
    """One Newton step; a parameter the step would take below its least value is held
    there and its target dropped from the step (``None``: a singular system)."""
    free = list(range(len(targets)))
    while free:
        try:
            step = np.linalg.solve(jacobian[np.ix_(free, free)], -np.asarray(misses)[free])
        except np.linalg.LinAlgError:
            return None
        out = {**theta, **{targets[i].parameter: targets[i].least for i in range(len(targets))
                           if i not in free}}
        below = [i for i, d in zip(free, step) if theta[targets[i].parameter] + d
                 < targets[i].least]
        if not below:
            return {**out, **{targets[i].parameter: theta[targets[i].parameter] + float(d)
                              for i, d in zip(free, step)}}
        free = [i for i in free if i not in below]
    return {**theta, **{t.parameter: t.least for t in targets}}
