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
"""

from __future__ import annotations

from typing import Any

from ..ir import COMPUTE_OPS, WEIGHT_GRADIENT_OPS, Op, Schedule
from .costs import StageCosts

__all__ = [
    "iteration_completions", "iteration_window", "busy_time", "bubble_fraction",
    "peak_activations", "weight_versions",
]

_F, _B, _W, _U = Op.FORWARD, Op.BACKWARD, Op.BACKWARD_WEIGHT, Op.STEP


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
    """Per rank: peak number of held activations and peak held bytes (module docstring).

    With chunks a rank holds one activation per (chunk, micro-batch), so a micro-batch that is
    in flight on two chunks of the same rank counts twice.
    """
    sizes = costs.activation_bytes
    counts, volumes = [], []
    for program in schedule.programs:
        held: dict[tuple[int, int | None, int], float] = {}  # (stage, mb, pipeline) -> share
        count = volume = peak_count = peak_volume = 0.0
        for action in program:
            op = action[0]
            if op is _F:
                share = 0.5 if action[3] else 1.0
                key = (action[1], action[2], action[6])
                held[key] = held.get(key, 0.0) + share
                count += share
                volume += share * sizes[action[1]]
                if count > peak_count:
                    peak_count = count
                if volume > peak_volume:
                    peak_volume = volume
            elif op is _B or op is _W:  # an I leaves the activation to its W
                share = held.pop((action[1], action[2], action[6]), 0.0)
                count -= share
                volume -= share * sizes[action[1]]
        counts.append(peak_count)
        volumes.append(peak_volume)
    return counts, volumes


def weight_versions(schedule: Schedule, *, keep_predicted: bool = False) -> list[int]:
    """Per stage: the most weight sets one copy of the stage holds at once.

    Held at a point of a rank's program: the current version (the number of the stage's
    updates so far), every older version that an action at or after that point still names
    (a stashed backward, or a vertical-sync/2BW/WPipe forward on an old version — those
    must be kept from the update that retires them until their last use, even before the
    micro-batch reaches the stage), and one transient set while a forward or backward runs
    on predicted weights (``lookahead`` > 0: PipeOptim, SpecTrain). This is what the
    runtime's :class:`pipeweave.runtime.execution.weights.StageWeights` keeps. With ``keep_predicted``
    (PipeOptim's ``backward="graph"``) a predicted forward's set is kept until the backward of
    its micro-batch instead (of a split backward, its ``W``; ``I`` and ``W`` name versions as
    ``B`` does). The maximum is taken over replicas and parallel pipelines (each
    pipeline keeps its own copy).
    """
    peak = [0] * schedule.num_stages
    for program in schedule.programs:
        last_use: dict[tuple[int, int, int], int] = {}
        for position, action in enumerate(program):
            op, stage, _, _, version, _, pipeline = action
            if op in COMPUTE_OPS and version is not None:
                last_use[(stage, pipeline, version)] = position
        current: dict[tuple[int, int], int] = {}
        old: dict[tuple[int, int], set[int]] = {}
        predicted: dict[tuple[int, int], set[tuple[int | None, int]]] = {}
        for position, action in enumerate(program):
            op, stage, microbatch, piece, version, lookahead, pipeline = action
            if op is not _U and op not in COMPUTE_OPS:
                continue
            key = (stage, pipeline)
            now = current.setdefault(key, 0)
            kept = old.setdefault(key, set())
            kept.difference_update([v for v in kept if last_use[(stage, pipeline, v)] < position])
            in_flight = predicted.setdefault(key, set())
            if op is _U:
                new = version if version is not None else now + 1
                if last_use.get((stage, pipeline, now), -1) > position:
                    kept.add(now)
                current[key] = new
                held = 1 + len(kept) + len(in_flight)
            elif op is _F and lookahead and keep_predicted:
                in_flight.add((microbatch, piece))
                held = 1 + len(kept) + len(in_flight)
            else:
                held = 1 + len(kept) + len(in_flight) + (1 if lookahead else 0)
                if op is _B or op is _W:  # a split backward's graph lives until its W
                    in_flight.difference_update([k for k in in_flight if k[0] == microbatch])
            if held > peak[stage]:
                peak[stage] = held
    return peak
