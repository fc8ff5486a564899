"""Activations in flight, read off a schedule: the most a rank holds at once, in count and bytes.

A forward's activation is held from the forward to its backward on the rank that runs both;
a split backward's ``I`` leaves it to its ``W`` (the weight gradient still needs the saved
inputs). A Slicer half (piece ``a``/``b``) holds half a micro-batch. Ranks run their programs
in order, so the peak is read off program order, whatever the costs. The simulator reports
this (``sim.metrics.peak_activations``); the search's lower bound uses it
(``auto.memory.memory_floor``); :mod:`.timeline` is the same walk with every other part of a
rank's memory added.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from ..ir import Action, Op, Schedule

__all__ = ["held_activations", "held_changes"]

_F, _B, _W = Op.FORWARD, Op.BACKWARD, Op.BACKWARD_WEIGHT


def held_changes(program: Sequence[Action]) -> Iterator[tuple[int, float]]:
    """The changes of a rank's held activations, in program order: ``(stage, +share)`` at
    each forward (a Slicer half 0.5), ``(stage, -share)`` where a ``B`` or ``W`` releases
    what its forwards left (an ``I`` leaves it to its ``W``)."""
    held: dict[tuple[object, ...], float] = {}  # (stage, micro-batch, pipeline) -> share
    for action in program:
        op = action[0]
        if op is _F:
            share = 0.5 if action[3] else 1.0
            key = (action[1], action[2], action[6])
            held[key] = held.get(key, 0.0) + share
            yield action[1], share
        elif op is _B or op is _W:
            share = held.pop((action[1], action[2], action[6]), 0.0)
            if share:
                yield action[1], -share


def held_activations(schedule: Schedule, sizes: Sequence[float]
                     ) -> tuple[list[float], list[float]]:
    """Per rank: the peak number of held activations and the peak held bytes, ``sizes[s]``
    bytes per micro-batch on stage ``s`` (module docstring).

    With chunks a rank holds one activation per (chunk, micro-batch), so a micro-batch that is
    in flight on two chunks of the same rank counts twice.
    """
    counts, volumes = [], []
    for program in schedule.programs:
        count = volume = peak_count = peak_volume = 0.0
        for stage, change in held_changes(program):
            count += change
            volume += change * sizes[stage]
            if count > peak_count:
                peak_count = count
            if volume > peak_volume:
                peak_volume = volume
        counts.append(peak_count)
        volumes.append(peak_volume)
    return counts, volumes
