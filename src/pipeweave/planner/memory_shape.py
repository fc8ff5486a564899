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

A synchronous schedule that :mod:`pipeweave.schedules.flush_arrays` lays out as columns is
analysed from those columns, no action built (:mod:`pipeweave.memory.lowered_columns`, then
:mod:`pipeweave.memory.walk_columns` per partition): the same numbers to the last bit
(``tests/test_memory_columns.py``), some 14x less time at planning scale (interleaved 1F1B
and ZB, 128 ranks x 2 chunks x 1,024 micro-batches a copy: 27.8 s of the memory model's
36.7 s CPU in the scale search, 2.0 s of 2.7 s after; docs/auto.md, "Limits").
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..ir import Layout, Op, Schedule
from ..schedules import Shape, lowered_schedule
from ..schedules.flush_arrays import OPS, flush_arrays
from ..memory.lowered_columns import ColumnTimeline, lower_columns
from ..memory.timeline import (PeakMoment, RankTimeline, StageBytes, analyse_programs,
                               graphless_forwards, peak_moments_of)
from ..memory.versions import weight_copies
from ..memory.walk_columns import WalkKeys, column_moments, graphless_steps, walk_keys
from ..collector import paused_collection

__all__ = ["ShapeAnalysis", "shape_analysis", "clear_shape_cache", "CACHE_SIZE",
           "is_cached", "COLUMNS", "analyse_shape"]

CACHE_SIZE = 8
"""Shapes kept (least recently used dropped): a 256-rank x 256-micro-batch analysis holds a
few hundred MB of actions, and the search examines the partitions of one shape together."""

COLUMNS = True
"""Whether a flush schedule's analysis is read off its columns (``tests/test_memory_columns.py``
turns it off to compare with the actions' analysis)."""


@dataclass
class ShapeAnalysis:
    """The shape-only part of the memory model for one (schedule, shape) (module docstring):
    the lowered actions' timelines, or, for a flush schedule laid out as columns, the same
    numbers as columns (:mod:`pipeweave.memory.lowered_columns`)."""

    name: str
    shape: Shape
    layout: Layout
    pipelines: int
    timelines: tuple[RankTimeline, ...] | None
    """Per rank, from the lowered actions (None: from columns)."""
    split: frozenset[int]
    """Stages whose backward stays split into I and W after lowering."""
    averages: bool
    """Whether the schedule averages parallel pipelines (AvgPipe's reference model)."""
    columns: tuple[ColumnTimeline, WalkKeys] | None = None
    _graphless: dict[tuple[tuple[bool, ...], str], Any] = field(default_factory=dict)
    _copies: dict[bool, list[int]] = field(default_factory=dict)

    @property
    def schedule(self) -> Schedule:
        """Lowered, as the runtime runs it (built here on demand where columns served)."""
        return lowered_schedule(self.name, self.shape)

    @property
    def num_stages(self) -> int:
        return self.layout.num_stages

    def graphless(self, recompute: Sequence[bool], backward: str) -> Any:
        """The forwards that keep no graph (:func:`~pipeweave.memory.timeline.graphless_forwards`,
        or per step of the columns, :func:`~pipeweave.memory.walk_columns.graphless_steps`),
        remembered."""
        key = (tuple(recompute), backward)
        if key not in self._graphless:
            self._graphless[key] = (
                graphless_forwards(self.schedule, recompute=recompute, backward=backward)
                if self.columns is None else
                graphless_steps(*self.columns, recompute, backward))
        return self._graphless[key]

    def moments(self, stages: Sequence[StageBytes], recompute: Sequence[bool],
                backward: str) -> list[PeakMoment]:
        """Per rank, the parts at its peak with ``stages``' bytes (the bytes-weighted walk)."""
        graphless = self.graphless(recompute, backward)
        if self.columns is None:
            assert self.timelines is not None
            return peak_moments_of(self.timelines, stages, graphless)
        return column_moments(*self.columns, stages, graphless)

    def copies(self, keep_predicted: bool) -> list[int]:
        """:func:`~pipeweave.memory.weight_copies`, remembered (a flush's from its columns:
        none on every stage that runs, as that function counts them)."""
        if keep_predicted not in self._copies:
            self._copies[keep_predicted] = (
                weight_copies(self.schedule, keep_predicted=keep_predicted)
                if self.columns is None else
                [0 if s in self.columns[0].present else -1 for s in range(self.num_stages)])
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
        analysis = analyse_shape(name, shape)
    _CACHE[key] = analysis
    while len(_CACHE) > CACHE_SIZE:
        _CACHE.popitem(last=False)
    return analysis


def analyse_shape(name: str, shape: Shape) -> ShapeAnalysis:
    """The analysis of ``name`` on ``shape``, uncached: from its columns where they cover
    it (:data:`COLUMNS`), else from its lowered actions."""
    return _from_columns(name, shape) or _from_actions(name, shape)


def _from_actions(name: str, shape: Shape) -> ShapeAnalysis:
    schedule = lowered_schedule(name, shape)
    programs = schedule.programs
    return ShapeAnalysis(
        name=name, shape=shape, layout=schedule.layout, pipelines=schedule.pipelines,
        timelines=tuple(analyse_programs(schedule)),
        split=frozenset(a[1] for p in programs for a in p if a[0] is Op.BACKWARD_INPUT),
        averages=any(a[0] is Op.AVERAGE for p in programs for a in p))


def _from_columns(name: str, shape: Shape) -> ShapeAnalysis | None:
    """The analysis from the schedule's columns (:mod:`pipeweave.schedules.flush_arrays`),
    where they and :func:`~pipeweave.memory.lowered_columns.lower_columns` cover the shape."""
    if not COLUMNS:
        return None
    programs = flush_arrays(name, shape)
    if programs is None or any(len(r) != 1 for r in programs.layout.stage_ranks):
        return None
    piece = (np.zeros(len(programs.op), dtype=np.int8) if programs.piece is None
             else programs.piece)
    timeline = lower_columns(OPS, programs.op, programs.stage, programs.microbatch, piece,
                             programs.version, programs.lengths,
                             [r[0] for r in programs.layout.stage_ranks])
    keys = None if timeline is None else walk_keys(timeline)
    if timeline is None or keys is None:
        return None
    return ShapeAnalysis(name=name, shape=shape, layout=programs.layout, pipelines=1,
                         timelines=None, split=timeline.split, averages=timeline.averages,
                         columns=(timeline, keys))


def is_cached(name: str, shape: Shape) -> bool:
    """Whether :func:`shape_analysis` of ``name`` and ``shape`` would be served from the cache
    (asking does not refresh it): a caller with several shapes to ask asks these first."""
    return _key(name, shape) in _CACHE


def clear_shape_cache() -> None:
    """Forget every analysis (tests compare cached and fresh results)."""
    _CACHE.clear()
