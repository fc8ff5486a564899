"""Measures read off a timed schedule: iteration time, bubble, held activations, weight versions.

Definitions (the same for simulated and measured timelines, see DESIGN.md "Measures"):

* **iteration completion** ``c_k``: the end of the last backward of any micro-batch of
  iteration ``k`` (micro-batches ``k*M .. k*M+M-1``, every stage and pipeline); of a split
  backward, the end of its ``W`` (the last gradient the update needs).
* **iteration time**: a synchronous schedule (a flush per iteration) repeats the same
  iteration, so it is ``makespan / K``. An asynchronous schedule has no flush; its steady
  state is measured between completions, leaving out the first iteration (pipeline fill) and
  the last one (drain)::

      K >= 3:  (c_{K-2} - c_0) / (K - 2)     window [c_0, c_{K-2}]
      K == 2:  c_1 - c_0                     window [c_0, c_1]   (includes the drain)
      K == 1:  makespan                      window [0, makespan]

* **bubble fraction**: ``1 - busy / (ranks x window)``, with ``busy`` the forward and backward
  time (``F``, ``B``, ``I``, ``W``) inside the window (updates, all-reduces and transfers are
  not compute).
* **held activations**: a forward's activation is held from the start of the forward to the
  end of its backward, on the rank that runs both. A split backward's ``I`` does not release
  it: the ``W`` still needs the stage's saved inputs (the weight gradient is the input
  activation times the output gradient), so it is held until the end of the ``W`` — what a
  zero-bubble schedule leaves alive by deferring its ``W``'s (Qi et al., ICLR 2024, §2: ZB-H1
  keeps 1F1B's peak of P on the first stage, ZB-H2 2P-1). A Slicer half (piece ``a``/``b``)
  holds half a micro-batch, so it counts 0.5 (and half the bytes). Ranks run their programs
  in order, so the peak is read off program order, independent of the costs.
* **weight versions** of a stage: its current weights plus every older version a later
  action still names (stashing, PipeDream §3.3; vertical sync; 2BW; WPipe's G0), plus one
  transient set while an action runs on predicted weights (PipeOptim, SpecTrain).

The last two are the memory model's (:mod:`pipeweave.memory`): the simulator reports what it
counts, so the two cannot disagree.
"""

from __future__ import annotations

from typing import Any

from ..ir import COMPUTE_OPS, WEIGHT_GRADIENT_OPS, Schedule
from ..memory import held_activations, weight_versions
from .costs import StageCosts

__all__ = [
    "iteration_completions", "iteration_window", "busy_time", "bubble_fraction",
    "peak_activations", "weight_versions",
]

def iteration_completions(schedule: Schedule, end: list[list[float]]) -> list[float]:
    """``c_k`` for every iteration ``k`` (see module docstring)."""
    per_iteration = schedule.microbatches
    completions = [0.0] * schedule.iterations
    for program, ends in zip(schedule.programs, end):
        for action, t in zip(program, ends):
            microbatch = action[2]
            if action[0] in WEIGHT_GRADIENT_OPS and microbatch is not None:
                k = microbatch // per_iteration
                if k < len(completions) and t > completions[k]:
                    completions[k] = t
    return completions


def iteration_window(
    schedule: Schedule, end: list[list[float]], makespan: float
) -> tuple[float, tuple[float, float]]:
    """``(iteration time, measuring window)`` as defined in the module docstring."""
    k = schedule.iterations
    if schedule.synchronous or k == 1:
        return makespan / k, (0.0, makespan)
    c = iteration_completions(schedule, end)
    if k == 2:
        return c[1] - c[0], (c[0], c[1])
    return (c[k - 2] - c[0]) / (k - 2), (c[0], c[k - 2])


def busy_time(
    schedule: Schedule, start: list[list[float]], end: list[list[float]],
    window: tuple[float, float] | None = None,
) -> list[float]:
    """Compute time (``F``, ``B``, ``I``, ``W``) of each rank, clipped to ``window`` when given."""
    busy = []
    compute = COMPUTE_OPS
    for program, starts, ends in zip(schedule.programs, start, end):
        if window is None:
            spans = [t1 - t0 for action, t0, t1 in zip(program, starts, ends)
                     if action[0] in compute]
        else:
            lo, hi = window
            spans = [min(t1, hi) - max(t0, lo) for action, t0, t1 in zip(program, starts, ends)
                     if action[0] in compute and t1 > lo and t0 < hi]
        busy.append(sum(spans))
    return busy


def bubble_fraction(busy: list[float], window: tuple[float, float]) -> float:
    """``1 - sum(busy) / (ranks x window length)``; 0 for an empty window."""
    length = window[1] - window[0]
    if length <= 0 or not busy:
        return 0.0
    return 1.0 - sum(busy) / (len(busy) * length)


def peak_activations(schedule: Schedule, costs: StageCosts) -> tuple[list[float], list[float]]:
    """Per rank: peak number of held activations and peak held bytes (module docstring), as the
    memory model counts them (:func:`pipeweave.memory.held_activations`)."""
    return held_activations(schedule, costs.activation_bytes)
