"""The memory model's analysis of a schedule's shape, done once and reused across partitions.

Everything :func:`pipeweave.planner.memory.predicted_memory` reads off the action lists
depends on the schedule's name and :class:`~pipeweave.schedules.Shape` alone, not on where
the stage boundaries fall or how many bytes a stage holds::

    lowered schedule, stages with a split backward, averaging     per shape
    delivery proofs -> messages in flight as position intervals   per shape (RankTimeline)
    forwards that keep no graph                                   per shape and recompute flags
    weight copies per stage                                       per shape and backward mode

So :func:`shape_analysis` computes them once per shape and keeps the last
:data:`CACHE_SIZE` shapes; a new partition of the same shape then costs only the
bytes-weighted walk (:func:`pipeweave.memory.timeline.peak_moments_of`). This is what
makes ``pipeweave auto`` affordable at scale: it asks the memory model about several
partition methods of every shape it simulates. The results are the same numbers, computed in
the same order (``tests/planner/test_memory_shape.py`` compares them with fresh analyses).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..ir import Op, Schedule
from ..schedules import Shape, lowered_schedule
from ..memory.timeline import RankTimeline, analyse_programs, graphless_forwards
from ..memory.versions import weight_copies
from ..collector import paused_collection

__all__ = ["ShapeAnalysis", "shape_analysis", "clear_shape_cache", "CACHE_SIZE",
           "is_cached"]

CACHE_SIZE = 8
"""Shapes kept (least recently used dropped): a 256-rank x 256-micro-batch analysis holds a
few hundred MB of actions, and the search examines the partitions of one shape together."""

Graphless = frozenset[tuple[int, int | None, int, int]]


@dataclass
class ShapeAnalysis:
    """The shape-only part of the memory model for one (schedule, shape) (module docstring)."""

    schedule: Schedule
    """Lowered, as the runtime runs it."""
    timelines: tuple[RankTimeline, ...]
    split: frozenset[int]
    """Stages whose backward stays split into I and W after lowering."""
    averages: bool
    """Whether the schedule averages parallel pipelines (AvgPipe's reference model)."""
    _graphless: dict[tuple[tuple[bool, ...], str], Graphless] = field(default_factory=dict)
    _copies: dict[bool, list[int]] = field(default_factory=dict)

    def graphless(self, recompute: Sequence[bool], backward: str) -> Graphless:
        """:func:`~pipeweave.memory.timeline.graphless_forwards`, remembered."""
        key = (tuple(recompute), backward)
        if key not in self._graphless:
            self._graphless[key] = graphless_forwards(self.schedule, recompute=recompute,
                                                      backward=backward)
        return self._graphless[key]

    def copies(self, keep_predicted: bool) -> list[int]:
        """:func:`~pipeweave.memory.weight_copies`, remembered."""
        if keep_predicted not in self._copies:
            self._copies[keep_predicted] = weight_copies(self.schedule,
                                                         keep_predicted=keep_predicted)
        return self._copies[keep_predicted]


_CACHE: OrderedDict[tuple[object, ...], ShapeAnalysis] = OrderedDict()


def _key(name: str, shape: Shape) -> tuple[object, ...]:
    return (name, shape.stages, shape.microbatches, shape.iterations, shape.chunks,
            shape.width, shape.replicas, shape.pipelines,
            json.dumps(dict(shape.options), sort_keys=True, default=repr))


def shape_analysis(name: str, shape: Shape) -> ShapeAnalysis:
    """The analysis of schedule ``name`` laid out for ``shape``, cached (module docstring)."""
    key = _key(name, shape)
    found = _CACHE.get(key)
    if found is not None:
        _CACHE.move_to_end(key)
        return found
    with paused_collection():  # millions of acyclic tuples (pipeweave.collector)
        schedule = lowered_schedule(name, shape)
        programs = schedule.programs
        analysis = ShapeAnalysis(
            schedule=schedule, timelines=tuple(analyse_programs(schedule)),
            split=frozenset(a[1] for p in programs for a in p if a[0] is Op.BACKWARD_INPUT),
            averages=any(a[0] is Op.AVERAGE for p in programs for a in p))
    _CACHE[key] = analysis
    while len(_CACHE) > CACHE_SIZE:
        _CACHE.popitem(last=False)
    return analysis


def is_cached(name: str, shape: Shape) -> bool:
    """Whether :func:`shape_analysis` of ``name`` and ``shape`` would be served from the cache
    (asking does not refresh it): a caller with several shapes to ask asks these first."""
    return _key(name, shape) in _CACHE


def clear_shape_cache() -> None:
    """Forget every analysis (tests compare cached and fresh results)."""
    _CACHE.clear()
