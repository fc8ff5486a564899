"""Each rank's fill and drain read off its program: a lower bound for any synchronous schedule.

The shape and plan bounds (:mod:`~pipeweave.auto.bounds`) know a schedule's order only where
it is declared (:mod:`~pipeweave.auto.fill_bound`, :mod:`~pipeweave.auto.interleaved_fill`).
Once a candidate's schedule is built (the search builds it for the memory floor anyway, one
build per shape shared by every partition and recomputation), each rank's program gives the
same chain for every schedule, V-shapes and zero-bubble ones included. A rank runs its
program in order; on rank ``r``, let its first gradient action (``B``, or ``I`` of a split
backward) be on stage ``s'`` for micro-batch ``m``:

- it starts no earlier than ``m``'s forwards through every stage and its gradients back from
  the last stage to ``s' + 1`` (each waits for the one before): ``sum_t f_t + sum_{t > s'}
  g_t`` (``g`` the gradient action, ``min(B, I)`` where the schedule splits backwards);
- from it on the rank runs, one after another, every action left in its program: the rest
  of its ``F``, ``B``, ``I``, ``W``, and its all-reduces and updates::

    T  >=  max over r of  sum_t f_t + sum_{t > s'_r} g_t + sum of the durations of r's
                          actions from its first gradient action on

Transfers, latencies and waits are left out (they only lengthen the chain); every term is a
duration of the plan's costs, so recomputation (in the costs) only raises it. The counts of
each rank's actions per op and stage from that point are read once per schedule (the
builders hand out the same object per shape) and weighed per plan in numpy. No bound (0)
where a schedule slices micro-batches (its ``F`` halves cost less than ``f``), runs several
pipelines, or ranks share cores. ``tests/auto/test_program_bound.py`` checks it against the
simulator on every synchronous schedule and every candidate of a space.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import numpy as np

from ..ir import Layout, Op, Schedule
from ..planner.evaluate import simulated_iterations
from ..planner.plan import Plan
from ..schedules import get_info
from ..schedules.flush_arrays import OPS, ArrayPrograms
from ..sim import Costs, StageCosts
from .copies import one_copy_plan
from .predict import one_copy_suffices
from .problem import AutoProblem
from .timing import floor_programs
from .window_bound import Windows, stage_windows, windows_bound

__all__ = ["program_bound", "plan_program_bound", "ProgramCounts", "program_counts"]

_WEIGHED = (Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT, Op.STEP,
            Op.ALL_REDUCE)
_GRADIENT = (Op.BACKWARD, Op.BACKWARD_INPUT)

ProgramCounts = tuple[np.ndarray, np.ndarray]
"""Per rank: the stage of its first gradient action (-1: none), and the count of its
actions from there on per op of :data:`_WEIGHED` and stage (``ranks x ops x stages``)."""

_COUNTS: dict[int, tuple[Schedule | ArrayPrograms, ProgramCounts | None]] = {}


def program_counts(schedule: Schedule | ArrayPrograms, stages: int) -> ProgramCounts | None:
    """The counts of ``schedule``'s programs, as actions or as columns
    (:mod:`~pipeweave.schedules.flush_arrays`) (:data:`ProgramCounts`), remembered for the
    last schedules; None where a program slices micro-batches or runs several pipelines."""
    cached = _COUNTS.get(id(schedule))
    if cached is not None and cached[0] is schedule:
        return cached[1]
    if len(_COUNTS) > 16:
        _COUNTS.clear()
    if isinstance(schedule, ArrayPrograms):  # Slicer halves: None, as _read says
        halves = schedule.piece is not None and bool(schedule.piece.any())
        counts = None if halves else _read_columns(schedule, stages)
    else:
        counts = _read(schedule, stages)
    _COUNTS[id(schedule)] = (schedule, counts)
    return counts


def _read_columns(programs: ArrayPrograms, stages: int) -> ProgramCounts:
    """The counts of programs laid out as columns, rank-major, in numpy."""
    ranks = programs.num_ranks
    rank = np.repeat(np.arange(ranks), programs.lengths)
    weighed = np.array([_WEIGHED.index(op) if op in _WEIGHED else -1 for op in OPS])
    gradient = np.isin(programs.op, [OPS.index(op) for op in _GRADIENT if op in OPS])
    at = np.flatnonzero(gradient)
    starts = np.full(ranks, np.iinfo(np.int64).max)
    holders, firsts = np.unique(rank[at], return_index=True)
    starts[holders] = at[firsts]
    first = np.full(ranks, -1, dtype=np.int64)
    first[holders] = programs.stage[starts[holders]]
    kind = weighed[programs.op]
    chosen = (np.arange(len(rank)) >= starts[rank]) & (kind >= 0)
    counts = np.zeros((ranks, len(_WEIGHED), stages))
    np.add.at(counts, (rank[chosen], kind[chosen], programs.stage[chosen]), 1.0)
    return first, counts


def _read(schedule: Schedule, stages: int) -> ProgramCounts | None:
    ops = {op: i for i, op in enumerate(_WEIGHED)}
    ranks = len(schedule.programs)
    first = np.full(ranks, -1, dtype=np.int64)
    counts = np.zeros((ranks, len(_WEIGHED), stages))
    for rank, program in enumerate(schedule.programs):
        if any(a.piece or a.pipeline for a in program):
            return None
        start = next((i for i, a in enumerate(program) if a.op in _GRADIENT), None)
        if start is None:
            continue
        first[rank] = program[start].stage
        rest = [(ops[a.op], a.stage) for a in program[start:] if a.op in ops]
        if rest:
            kinds, where = np.array(rest, dtype=np.int64).T
            np.add.at(counts[rank], (kinds, where), 1.0)
    return first, counts


def program_bound(schedule: Schedule | ArrayPrograms, table: StageCosts, *,
                  split: bool) -> float:
    """The largest over the ranks of the chain above (0 where it does not apply); ``split``:
    the schedule may split backwards (its gradient action is ``I``)."""
    return _weigh(program_counts(schedule, len(table.forward)), table, split=split)


def _weigh(read: ProgramCounts | None, table: StageCosts, *, split: bool) -> float:
    """:func:`program_bound` of counts already read (0 for none)."""
    if read is None:
        return 0.0
    first, counts = read
    forward = np.asarray(table.forward, dtype=float)
    backward = np.asarray(table.backward, dtype=float)
    gradient = np.minimum(backward, table.input_grad) if split else backward
    behind = np.concatenate([np.cumsum(gradient[::-1])[::-1], [0.0]])  # sum over t >= s
    durations = np.stack([forward, backward, np.asarray(table.input_grad, dtype=float),
                          np.asarray(table.weight_grad, dtype=float),
                          np.asarray(table.update, dtype=float),
                          np.asarray(table.all_reduce, dtype=float)])
    work = np.einsum("ros,os->r", counts, durations)
    started = first >= 0
    if not started.any():
        return 0.0
    chain = forward.sum() + behind[first[started] + 1] + work[started]
    return float(chain.max())


class _Read(NamedTuple):
    """What the bounds read off one shape's programs: all they need, small enough to keep
    for many shapes after the programs themselves are dropped."""

    counts: ProgramCounts | None
    windows: Windows | None
    layout: Layout


SHAPES_KEPT = 64
"""Shapes whose reads :func:`plan_program_bound` keeps (a few MB each at 512 stages)."""

_READS: OrderedDict[tuple[object, ...], _Read] = OrderedDict()


def _shape_read(plan: Plan, one_copy: bool) -> _Read:
    """The counts and windows of ``plan``'s programs, kept per shape: the partitions of a
    shape (every method, recompute prefix and APC variant) share them, and a shape pruned
    by the bound is not built again for its next partition, which the builders, keeping
    the last few shapes, would otherwise do when other shapes came between (ValueError:
    the schedule refuses the shape)."""
    own = one_copy_plan(plan) if one_copy else plan
    key = (plan.schedule, get_info(plan.schedule).generate, own.shape(1), one_copy)
    read = _READS.get(key)
    if read is None:
        schedule = floor_programs(plan, one_copy=one_copy)
        read = _Read(program_counts(schedule, len(plan.stages)), stage_windows(schedule),
                     schedule.layout)
        _READS[key] = read
        if len(_READS) > SHAPES_KEPT:
            _READS.popitem(last=False)
    else:
        _READS.move_to_end(key)
    return read


def plan_program_bound(plan: Plan, costs: Costs, problem: AutoProblem) -> float:
    """:func:`program_bound` of ``plan``'s programs as the simulation lays them out, or the
    :func:`~pipeweave.auto.window_bound.window_bound` of the same programs, the larger (one
    copy where that suffices; as columns where the search times them so,
    :func:`~pipeweave.auto.timing.floor_programs`; the builders keep the last shapes, so the
    memory floor and the simulation reuse them; what the bounds read is kept per shape,
    :func:`_shape_read`); 0 for an asynchronous schedule, with shared cores, or where the
    schedule refuses the plan (the simulation then says so)."""
    cores = problem.shared_cores
    info = get_info(plan.schedule)
    if not info.synchronous or (cores is not None and cores < plan.world_size) \
            or simulated_iterations(plan.schedule) != 1:
        return 0.0
    try:  # the columns where the search times the shape as columns, else the schedule
        read = _shape_read(plan, one_copy_suffices(plan, problem))
    except ValueError:
        return 0.0
    table = costs.resolve(len(plan.stages))  # and the micro-batches each stage keeps open
    split = info.split_backward
    windows = 0.0 if read.windows is None else \
        windows_bound(read.windows, table, read.layout, split=split)
    return max(_weigh(read.counts, table, split=split), windows)
