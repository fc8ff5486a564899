"""The held activations of :mod:`.held`, counted once per schedule and weighed per partition.

:func:`~pipeweave.memory.held_activations` walks a schedule's programs for every set of
per-stage bytes. A search weighs the same schedule (one shape) with the bytes of many
partitions and recomputations, so :func:`held_peak_bytes` walks it once: for each rank, the
number of activations it holds of each of its stages right after each forward (the peak is
right after some forward: only forwards add), as a matrix ``counts[event, stage]``; the peak
bytes for ``sizes`` are then ``max over events of counts @ sizes``. Remembered per schedule
(by identity, the last :data:`CACHE_SIZE`). The counts are exact (halves are ``0.5``); the
bytes are summed in another order than the walk's running total, so they may differ from it
in the last bits (``tests/test_held_counts.py``).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from ..ir import Action, Op, Schedule
from .held import held_changes

__all__ = ["held_peak_bytes", "CACHE_SIZE"]

CACHE_SIZE = 8
"""Schedules whose counts are remembered."""

_cache: OrderedDict[int, tuple[weakref.ref[Schedule], list[tuple[np.ndarray, np.ndarray]]]] = \
    OrderedDict()


def held_peak_bytes(schedule: Schedule, sizes: Sequence[float]) -> list[float]:
    """Per rank: the most activation bytes held at once, ``sizes[s]`` bytes per micro-batch
    on stage ``s`` (:func:`~pipeweave.memory.held_activations`' second list, module
    docstring)."""
    weights = np.asarray(sizes, dtype=float)
    peaks = []
    for stages, counts in _counts(schedule):
        peaks.append(float((counts @ weights[stages]).max()) if len(counts) else 0.0)
    return peaks


def _counts(schedule: Schedule) -> list[tuple[np.ndarray, np.ndarray]]:
    key = id(schedule)
    hit = _cache.get(key)
    if hit is not None and hit[0]() is schedule:
        _cache.move_to_end(key)
        return hit[1]
    counted = [_rank_counts(program) for program in schedule.programs]
    _cache[key] = (weakref.ref(schedule), counted)
    while len(_cache) > CACHE_SIZE:
        _cache.popitem(last=False)
    return counted


def _rank_counts(program: Sequence[Action]) -> tuple[np.ndarray, np.ndarray]:
    """``(stages, counts)`` of one rank: its stages, and a row per forward of how many
    activations of each it holds right after that forward (:mod:`.held`'s rules)."""
    stages = sorted({a.stage for a in program if a.op is Op.FORWARD})
    column = {s: i for i, s in enumerate(stages)}
    current = [0.0] * len(stages)
    rows: list[list[float]] = []
    for stage, change in held_changes(program):
        current[column[stage]] += change
        if change > 0:  # only forwards add: the peak is right after one
            rows.append(current.copy())
    return np.asarray(stages, dtype=np.int64), np.asarray(rows, dtype=float).reshape(
        len(rows), len(stages))
