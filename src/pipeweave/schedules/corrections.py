"""Stale-weight corrections of the literature, as options of the asynchronous schedules.

Three options (docs/semantics.md, "Stale-weight corrections"), each declared by the schedules
it applies to (their registry entry's ``options``) and checked here, where the generator reads
them:

* ``warmup=K`` — the first ``K`` iterations run synchronously (every update lands before the
  next forward that follows it, no stale weight), then the schedule's own asynchrony. It is
  data in the schedule (:func:`pipeweave.schedules.async_common.drain_segments`): the runtime,
  the simulator and the validator read it like a drain.
* ``nesterov=G`` — the Nesterov correction of Ajanthan et al. (ICML 2025, arXiv:2505.01099):
  every update is a Nesterov (look-ahead) step on the stale gradient, its momentum
  coefficient raised with the stage's delay ``τ_s`` towards ``G`` (:func:`nesterov_momentum`).
* ``pipemare=K`` — PipeMare's T1 (Yang et al., MLSys 2021): the step size of stage ``s`` is
  divided by ``τ_s`` at the first update and annealed back to the base rate over ``K``
  updates (:func:`pipemare_scale`).
* ``pipemare_t2`` — PipeMare's T2 (discrepancy correction) is refused: it extrapolates the
  backward's weights of a pipeline that does *not* stash weights; every schedule here that
  takes PipeMare stashes, so its backward already runs on its forward's weights.

``nesterov`` and ``pipemare`` act on the optimizer's step, so the runtime applies them
(:mod:`pipeweave.runtime.execution.corrections`), with ``τ_s`` read off the schedule by
:func:`steady_delays`. No torch here.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from ..ir import Op, Schedule
from .registry import Shape

__all__ = ["WARMUP", "NESTEROV", "PIPEMARE", "PIPEMARE_T2", "STEP_OPTIONS", "warmup_iterations",
           "check_corrections", "stage_delays", "steady_delays", "nesterov_momentum", "pipemare_scale"]

WARMUP = "warmup"
NESTEROV = "nesterov"
PIPEMARE = "pipemare"
PIPEMARE_T2 = "pipemare_t2"
STEP_OPTIONS = (NESTEROV, PIPEMARE)
"""The options the runtime applies around each update (the others are schedule data)."""


def _integer(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def warmup_iterations(name: str, shape: Shape) -> int:
    """The shape's ``warmup`` option, checked (0: none)."""
    value = shape.option(WARMUP, 0)
    if not _integer(value, 0):
        raise ValueError(f"{name} option warmup must be an integer >= 0 (synchronous iterations "
                         f"before asynchrony), got {value!r}; e.g. --option warmup=20")
    return value


def check_corrections(name: str, shape: Shape) -> None:
    """ValueError, one line naming the value and the fix, for a bad correction option."""
    warmup_iterations(name, shape)
    top = shape.option(NESTEROV, None)
    if top is not None and (isinstance(top, bool) or not isinstance(top, (int, float))
                            or not 0.0 < top < 1.0):
        raise ValueError(f"{name} option nesterov must be the momentum coefficient reached at "
                         f"the deepest delay, a number in (0, 1), got {top!r}; e.g. "
                         f"--option nesterov=0.99 (the paper's)")
    anneal = shape.option(PIPEMARE, None)
    if anneal is not None and not _integer(anneal, 1):
        raise ValueError(f"{name} option pipemare must be the updates over which the step size "
                         f"anneals back to the base rate, an integer >= 1, got {anneal!r}; "
                         f"e.g. --option pipemare=500")
    if PIPEMARE_T2 in shape.options:
        raise ValueError(f"{name} option pipemare_t2 (PipeMare's discrepancy correction) is "
                         f"refused: {name} stashes weights, so each backward already runs on its "
                         f"forward's weights and T2 has nothing to correct; drop it")


def stage_delays(schedule: Schedule) -> dict[int, int]:
    """``τ_s`` of every stage: the most updates that land on the stage between the version a
    backward differentiates at and the update that applies its gradient (the steady-state
    delay: PipeDream ``P - s - 1``, vertical sync ``P - 1``, 2BW 1, WPipe's G0 1 and G1 0)."""
    delays: dict[int, int] = {}
    for program in schedule.programs:
        updates: dict[int, int] = {}
        for action in program:
            if action.op is Op.STEP:
                updates[action.stage] = updates.get(action.stage, 0) + 1
            elif action.op in (Op.BACKWARD, Op.BACKWARD_WEIGHT) and action.version is not None:
                delay = updates.get(action.stage, 0) - action.version
                delays[action.stage] = max(delays.get(action.stage, 0), delay)
    return delays


def steady_delays(name: str, shape: Shape) -> dict[int, int]:
    """``τ_s`` of schedule ``name`` in steady state: :func:`stage_delays` of the same shape
    without ``warmup`` and ``drain`` (which only shorten delays for a while), laid out over
    enough iterations to reach it; the delay the corrections are defined with, however short
    the run."""
    from .async_common import DRAIN  # the asynchronous order imports this module
    from .registry import build_schedule

    options = {k: v for k, v in shape.options.items() if k not in (WARMUP, DRAIN)}
    copies = max(shape.width, *(shape.replicas or (1,)))
    steady = replace(shape, iterations=shape.stages * copies + 2, options=options)
    return stage_delays(build_schedule(name, steady))


def nesterov_momentum(base: float, delay: int, deepest: int, top: float) -> float:
    """The momentum coefficient of a stage with delay ``delay``: ``base + delay * (top - base)
    / (deepest + 1)``, ``deepest`` the largest delay of the pipeline (PluralisResearch/AsyncPP,
    ``--adaptive_momentum``, whose ``num_stages`` is ``deepest + 1`` for PipeDream)."""
    return base + delay * (top - base) / (deepest + 1)


def pipemare_scale(delay: int, step: int, anneal: int) -> float:
    """PipeMare T1: the factor on the step size of update ``step`` (1-based) of a stage with
    delay ``delay``, ``delay ** -(1 - min(step / anneal, 1))`` (1 where ``delay <= 1``)."""
    if delay <= 1:
        return 1.0
    return math.pow(delay, -(1.0 - min(step / anneal, 1.0)))
