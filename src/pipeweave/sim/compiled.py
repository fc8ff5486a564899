"""The timed walk of :mod:`pipeweave.ir.walk`, compiled once per schedule and run with numpy.

:func:`pipeweave.ir.walk.walk` is a longest-path computation over the DAG "program order +
data dependencies + collectives", done action by action in Python. A search times the same
schedule under many costs (every partition, recomputation and APC variant of a shape;
AutoPipe re-simulates its 1F1B for each split it tries), so the graph is compiled once:

* every action gets its **level**, the number of actions on the longest chain of
  predecessors before it (:func:`longest_chains`, level by level over the edges below in
  numpy, what a walk with every action lasting 1 gives, without a Python walk; a cycle or a
  missing action leaves the schedule to the walk, which raises its usual error); actions are
  renumbered level by level;
* every edge into an action is kept as ``(source, delay kind)``: the rank's previous action
  (no delay), a dependency on another rank (``latency + transfer[boundary]``, halved for a
  Slicer half), a global check's state (``latency``), and for an all-reduce the previous
  action of every replica that takes part (it starts when the last one arrives).

Timing a compiled schedule is then one numpy pass per level::

    start[level] = max over its edges of (end[source] + delay)      (np.maximum.reduceat)
    end[level]   = start[level] + duration

the same additions and maxima as the walk, in the same floating point, so the same times to
the last bit (``tests/sim/test_compiled.py`` compares them on every registered schedule).
A compute-only schedule whose stages each run on one rank (AutoPipe's 1F1B among them) has
its edges found in numpy from its actions read as columns
(:func:`~pipeweave.sim.compiled_arrays.compile_columns`, the rule of
:mod:`~pipeweave.sim.compiled_arrays`), not by asking :func:`~pipeweave.ir.dependencies`
action by action: the same graph, half the compilation.
A level holds about one action per rank, so it pays where ranks are many: a schedule with
fewer than :data:`MIN_WIDTH` actions per level on average is left to the walk
(:func:`compile_schedule` returns ``None``).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ir import CHECK_OPS, Action, Op, Schedule, collective_key, dependencies
from ..ir.walk import Location
from .costs import StageCosts
from .halves import factored_durations, piece_factor

__all__ = ["Compiled", "compile_schedule", "compiled_for", "longest_chains", "expect_timings",
           "assemble", "MIN_WIDTH", "CACHE_SIZE", "ROW", "SAME", "DATA"]

MIN_WIDTH = 8
"""Fewest actions per level, on average, for the compiled walk to beat the Python walk (a
numpy call per level costs as much as walking a few actions)."""

_ROWS = (Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT, Op.STEP,
         Op.ALL_REDUCE, Op.AVERAGE)
_ROW = {op: _ROWS.index(op) if op in _ROWS else len(_ROWS) for op in Op}
"""Row of each op in the cost table; ops without a cost (sends, receives, checks) read a
row of zeros."""

_SAME, _DATA, _CHECK = 0, 1, 2
SAME, DATA = _SAME, _DATA
ROW = _ROW
"""Edge kinds: the rank's previous action, a data dependency on another rank, a global
check's state from another rank."""


@dataclass(frozen=True)
class Compiled:
    """A schedule's graph in level order (module docstring); arrays indexed by the new
    numbering unless named otherwise."""

    levels: np.ndarray
    """``levels[k] .. levels[k + 1]``: the actions of level ``k``."""
    edge_levels: np.ndarray
    """``edge_levels[k] .. edge_levels[k + 1]``: the edges into level ``k`` (by target)."""
    segments: tuple[np.ndarray, ...]
    """Per level: where each target's edges start, relative to the level's first edge."""
    source: np.ndarray
    kind: np.ndarray
    boundary: np.ndarray
    """A data edge's stage boundary (``min`` of the two stages): its transfer; -1 for the
    other edges."""
    half: np.ndarray
    """A data edge from a Slicer half: half the transfer."""
    row: np.ndarray
    stage: np.ndarray
    factor: np.ndarray
    """0.5 for a Slicer half, 2 for the backward of a micro-batch forwarded in halves, else 1
    (:mod:`pipeweave.sim.halves`)."""
    position: np.ndarray
    """New number of each action, in rank-major program order."""
    lengths: tuple[int, ...]
    """Actions per rank."""

    def times(self, costs: StageCosts) -> tuple[np.ndarray, np.ndarray]:
        """Start and end of every action under ``costs``, in rank-major program order."""
        table = np.zeros((len(_ROWS) + 1, max(len(costs.forward), 1)))
        for i, values in enumerate((costs.forward, costs.backward, costs.input_grad,
                                    costs.weight_grad, costs.update, costs.all_reduce,
                                    costs.average)):
            table[i, :len(values)] = values
        duration = factored_durations(costs, table, self.row, self.stage, self.factor, _ROWS)
        delay = self._delays(costs)
        start = np.zeros(len(self.row))
        end = duration.copy()  # level 0 starts at 0
        levels, edge_levels, segments, source = self.levels, self.edge_levels, self.segments, \
            self.source
        for k in range(1, len(levels) - 1):
            lo, hi, a, b = levels[k], levels[k + 1], edge_levels[k], edge_levels[k + 1]
            ready = end[source[a:b]]
            if delay is not None:
                ready += delay[a:b]
            first = np.maximum.reduceat(ready, segments[k])
            start[lo:hi] = first
            end[lo:hi] = first + duration[lo:hi]
        return start[self.position], end[self.position]

    def _delays(self, costs: StageCosts) -> np.ndarray | None:
        """Each edge's delay, as :func:`pipeweave.sim.simulator._delay_fn` prices it (None:
        every delay is zero, as the walk has no delay function then)."""
        if costs.latency == 0 and not any(costs.transfer):
            return None
        transfer = np.asarray(list(costs.transfer) + [0.0])
        per_edge = transfer[self.boundary]
        per_edge = np.where(self.half, per_edge * 0.5, per_edge)
        data = costs.latency + per_edge
        return np.where(self.kind == _DATA, data,
                        np.where(self.kind == _CHECK, costs.latency, 0.0))

    def rows(self, flat: np.ndarray) -> list[list[float]]:
        """``flat`` (rank-major) as one list per rank."""
        cut = np.cumsum((0,) + self.lengths)
        return [flat[cut[r]:cut[r + 1]].tolist() for r in range(len(self.lengths))]


CACHE_SIZE = 4
"""Compiled schedules remembered (each holds a few arrays of its actions and edges)."""

_seen: OrderedDict[int, weakref.ref[Schedule]] = OrderedDict()
_compiled: OrderedDict[int, tuple[weakref.ref[Schedule], Compiled | None]] = OrderedDict()


def compiled_for(schedule: Schedule, index: dict[Action, Location]) -> Compiled | None:
    """``schedule`` compiled, from its second timing on (the first is walked: compiling costs
    about two walks, and a schedule timed once gains nothing); remembered by identity for
    the last :data:`CACHE_SIZE` schedules (schedules are immutable and the builders hand out
    the same object for the same shape). None: walk it."""
    key = id(schedule)
    hit = _compiled.get(key)
    if hit is not None and hit[0]() is schedule:
        _compiled.move_to_end(key)
        return hit[1]
    seen = _seen.pop(key, None)
    if seen is None or seen() is not schedule:
        _remember(_seen, key, weakref.ref(schedule))
        return None
    compiled = compile_schedule(schedule, index)
    _remember(_compiled, key, (weakref.ref(schedule), compiled))
    return compiled


def expect_timings(schedule: Schedule) -> None:
    """Say that ``schedule`` will be timed several times (AutoPipe's evaluator, one split
    after another): :func:`compiled_for` compiles it at its first timing instead of walking
    it once first."""
    key = id(schedule)
    hit = _compiled.get(key)
    if hit is None or hit[0]() is not schedule:
        _remember(_seen, key, weakref.ref(schedule))


def _remember(cache: OrderedDict[int, Any], key: int, value: Any) -> None:
    cache[key] = value
    while len(cache) > CACHE_SIZE:
        cache.popitem(last=False)


def compile_schedule(schedule: Schedule, index: dict[Action, Location], *,
                     min_width: int | None = None) -> Compiled | None:
    """``schedule`` compiled (module docstring); None where it deadlocks (the walk then
    raises what it always raised) or its levels hold fewer than ``min_width`` actions on
    average (default :data:`MIN_WIDTH`)."""
    width = MIN_WIDTH if min_width is None else min_width
    from .compiled_arrays import action_columns, compile_columns  # it builds on this module
    columns = action_columns(schedule)
    if columns is not None:  # compute-only: the same edges, found in numpy
        return compile_columns(schedule, columns, width)
    programs = schedule.programs
    lengths = tuple(len(p) for p in programs)
    try:
        edges = _edges(schedule, index, np.cumsum((0,) + lengths))
    except KeyError:  # a dependency no rank runs: the walk raises its error
        return None
    level = longest_chains(edges[0], edges[1], sum(lengths))
    if level is None or len(level) == 0 or len(level) < width * (int(level.max()) + 1):
        return None  # a cycle (the walk deadlocks and says where), or too narrow
    return assemble(edges, level, _column(programs, lambda a: _ROW[a.op]),
                    _column(programs, lambda a: a.stage),
                    _column(programs, piece_factor(programs), float), lengths)


def assemble(edges: tuple[np.ndarray, ...], level: np.ndarray, row: np.ndarray,
             stage: np.ndarray, factor: np.ndarray, lengths: tuple[int, ...]) -> Compiled:
    """The :class:`Compiled` graph of actions numbered rank-major: ``edges`` as
    ``(target, source, kind, boundary, half)``, each action's ``level``
    (:func:`longest_chains`), cost ``row`` (:data:`ROW`), ``stage`` and duration ``factor``."""
    position = np.empty(len(level), dtype=np.int64)
    order = np.argsort(level, kind="stable")
    position[order] = np.arange(len(level))
    target = position[edges[0]]
    by_target = np.argsort(target, kind="stable")
    target = target[by_target]
    source = position[edges[1][by_target]]
    sorted_level = level[order]
    count = int(sorted_level[-1]) + 1
    levels = np.searchsorted(sorted_level, np.arange(count + 1))
    edge_levels = np.searchsorted(target, levels)
    segments = tuple(_segments(target[edge_levels[k]:edge_levels[k + 1]], levels[k])
                     for k in range(count))
    return Compiled(levels=levels, edge_levels=edge_levels, segments=segments, source=source,
                    kind=edges[2][by_target], boundary=edges[3][by_target],
                    half=edges[4][by_target], row=row[order], stage=stage[order],
                    factor=factor[order], position=position, lengths=lengths)


def longest_chains(target: np.ndarray, source: np.ndarray, count: int) -> np.ndarray | None:
    """Per action (``count`` of them, edges ``source -> target``): the actions on the longest
    chain of predecessors before it, found level by level (Kahn's order, one numpy pass per
    level: an action joins the level after its last predecessor's); None where the edges
    have a cycle. The same numbers as a walk with every action lasting 1, without a walk."""
    by_source = np.argsort(source, kind="stable")
    successors = target[by_source]
    first = np.searchsorted(source[by_source], np.arange(count + 1))
    waiting = np.bincount(target, minlength=count)
    level = np.full(count, -1, dtype=np.int64)
    frontier = np.flatnonzero(waiting == 0)
    depth = 0
    while len(frontier):
        level[frontier] = depth
        starts, stops = first[frontier], first[frontier + 1]
        sizes = stops - starts
        total = int(sizes.sum())
        if total == 0:
            break
        offsets = np.repeat(starts - np.cumsum(sizes) + sizes, sizes) + np.arange(total)
        reached, arrivals = np.unique(successors[offsets], return_counts=True)
        waiting[reached] -= arrivals
        frontier = reached[waiting[reached] == 0]
        depth += 1
    return None if np.any(level < 0) else level


def _segments(targets: np.ndarray, first: int) -> np.ndarray:
    """Where each target's run of edges starts (every action past level 0 has an edge)."""
    if len(targets) == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.diff(targets, prepend=first - 1))


def _column(programs: Any, read: Any, dtype: Any = np.int64) -> np.ndarray:
    return np.fromiter((read(a) for program in programs for a in program), dtype=dtype,
                       count=sum(len(p) for p in programs))


def _edges(schedule: Schedule, index: dict[Action, Location],
           offset: np.ndarray) -> tuple[np.ndarray, ...]:
    """Every edge as ``(target, source, kind, boundary, half)``, flat rank-major numbers."""
    layout, lowered, programs = schedule.layout, schedule.lowered, schedule.programs
    starts = [int(o) for o in offset]
    edges: list[tuple[int, int, int, int, bool]] = []
    add = edges.append
    groups: dict[object, list[int]] = {}
    all_reduce, checks = Op.ALL_REDUCE, CHECK_OPS
    for rank, program in enumerate(programs):
        base = starts[rank]
        for position, action in enumerate(program):
            me = base + position
            if action.op is all_reduce:
                groups.setdefault(collective_key(action), []).append(me)
                continue
            if position:
                add((me, me - 1, _SAME, -1, False))
            for dep in dependencies(action, layout, lowered=lowered):
                dep_rank, dep_position = index[dep]
                source = starts[dep_rank] + dep_position
                if dep_rank == rank:
                    add((me, source, _SAME, -1, False))
                    continue
                producer = programs[dep_rank][dep_position]
                if producer.op in checks:
                    add((me, source, _CHECK, -1, False))
                else:
                    add((me, source, _DATA, min(producer.stage, action.stage),
                         bool(producer.piece)))
    firsts = set(starts)
    for members in groups.values():  # each starts when the last replica reaches it
        add_group = [(me, other - 1, _SAME, -1, False) for me in members for other in members
                     if other not in firsts]
        edges.extend(add_group)
    table = np.array(edges, dtype=np.int64).reshape(len(edges), 5)
    return (table[:, 0], table[:, 1], table[:, 2].astype(np.int8), table[:, 3],
            table[:, 4].astype(bool))
