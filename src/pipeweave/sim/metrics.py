"""Measures read off a timed schedule: iteration time, bubble, held activations, weight versions.

Definitions (the same for simulated and measured timelines, see DESIGN.md "Measures"):

* **iteration completion** ``c_k``: the end of the last backward of any micro-batch of
  iteration ``k`` (micro-batches ``k*M .. k*M+M-1``, every stage and pipeline).
* **iteration time**: a synchronous schedule (a flush per iteration) repeats the same
  iteration, so it is ``makespan / K``. An asynchronous schedule has no flush; its steady
  state is measured between completions, leaving out the first iteration (pipeline fill) and
  the last one (drain)::

      K >= 3:  (c_{K-2} - c_0) / (K - 2)     window [c_0, c_{K-2}]
      K == 2:  c_1 - c_0                     window [c_0, c_1]   (includes the drain)
      K == 1:  makespan                      window [0, makespan]

* **bubble fraction**: ``1 - busy / (ranks x window)``, with ``busy`` the forward and backward
  time inside the window (updates, all-reduces and transfers are not compute).
* **held activations**: a forward's activation is held from the start of the forward to the
  end of its backward, on the rank that runs both. A Slicer half (piece ``a``/``b``) holds
  half a micro-batch, so it counts 0.5 (and half the bytes). Ranks run their programs in
  order, so the peak is read off program order, independent of the costs.
* **weight versions** of a stage: its current weights plus every older version an in-flight
  micro-batch (forward done, backward not yet) still needs for its backward (stashing,
  PipeDream §3.3). The backward uses version ``F.version + F.lookahead``; with lookahead
  (PipeOptim) that is the stage's current weights by the time the backward runs, so it costs
  no stashed copy, and the predicted weights of the forward are transient.
"""

from __future__ import annotations

from typing import Any

from ..ir import Op, Schedule
from .costs import StageCosts

__all__ = [
    "iteration_completions", "iteration_window", "busy_time", "bubble_fraction",
    "peak_activations", "weight_versions",
]

_F, _B, _U = Op.FORWARD, Op.BACKWARD, Op.STEP


def iteration_completions(schedule: Schedule, end: list[list[float]]) -> list[float]:
    """``c_k`` for every iteration ``k`` (see module docstring)."""
    per_iteration = schedule.microbatches
    completions = [0.0] * schedule.iterations
    for program, ends in zip(schedule.programs, end):
        for action, t in zip(program, ends):
            microbatch = action[2]
            if action[0] is _B and microbatch is not None:
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
    """Forward + backward time of each rank, clipped to ``window`` when given."""
    busy = []
    compute = (_F, _B)
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
            elif op is _B:
                share = held.pop((action[1], action[2], action[6]), 0.0)
                count -= share
                volume -= share * sizes[action[1]]
        counts.append(peak_count)
        volumes.append(peak_volume)
    return counts, volumes


def weight_versions(schedule: Schedule) -> list[int]:
    """Per stage: the most weight versions one copy of the stage holds at once.

    A stage's current version is the number of its updates so far (or the ``U``'s version).
    The maximum is taken over replicas and parallel pipelines (each pipeline keeps its own
    copy of the stage, so a rank hosting ``N`` pipelines holds ``N`` such sets).
    """
    peak = [0] * schedule.num_stages
    for program in schedule.programs:
        # One state per copy (stage, pipeline) of the weights on this rank:
        # [current version, in-flight count per referenced version,
        #  number of referenced versions older than current, micro-batch -> backward's version]
        copies: dict[tuple[int, int], list[Any]] = {}
        for action in program:
            op, stage, microbatch, _, version, lookahead, pipeline = action
            if op is not _F and op is not _B and op is not _U:
                continue
            state = copies.get((stage, pipeline))
            if state is None:
                state = copies[(stage, pipeline)] = [0, {}, 0, {}]
            current, refs, stashed, backward_version = state
            if op is _F:
                if microbatch in backward_version:  # second half of a sliced micro-batch
                    continue
                used = (version if version is not None else current) + lookahead
                backward_version[microbatch] = used
                if used in refs:
                    refs[used] += 1
                else:
                    refs[used] = 1
                    if used < current:
                        stashed = state[2] = stashed + 1
            elif op is _B:
                used = backward_version.pop(microbatch, None)
                if used is not None:
                    if refs[used] > 1:
                        refs[used] -= 1
                    else:
                        del refs[used]
                        if used < current:
                            state[2] = stashed - 1
                continue
            else:
                new = version if version is not None else current + 1
                if new == current + 1:  # the usual case: one more update
                    if current in refs:
                        stashed = state[2] = stashed + 1
                else:  # recount the referenced versions older than the new current one
                    stashed = state[2] = sum(1 for v in refs if v < new)
                state[0] = new
            if stashed + 1 > peak[stage]:
                peak[stage] = stashed + 1
    return peak
