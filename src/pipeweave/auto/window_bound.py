"""How many micro-batches a stage keeps in flight bounds its pace: a lower bound (Little's law).

A micro-batch ``m`` is *open* on stage ``s`` from the start of its forward there to the end of
its gradient action there (``B``, or ``I`` of a split backward). That interval lasts at least
its forward, its round trip behind ``s`` and its gradient::

    L_s = f_s + down(s) + g_s
    down(s) = sum over t > s of (f_t + g_t) + both crossings of every boundary behind s

(``g`` is ``min(B, I)`` where the schedule splits backwards; a crossing costs the latency and
the transfer, none between two stages on one rank, as the simulator delays them). A rank
runs its program in order, so at any moment the actions started are a prefix of it and the
micro-batches open on ``s`` are at most ``K_s``, the largest count of forwards less gradient
actions of ``s`` over the prefixes of the rank's program (the action running is either in
that count or, a gradient, not yet ended). The ``n_s`` intervals of the rank's micro-batches
on ``s`` lie between the first forward's start, no earlier than ``head(s) = sum over t < s
of (f_t + crossing_t)``, and the last gradient's end, after which that micro-batch's
gradient still crosses the stages in front of ``s`` and each of them all-reduces and
updates after it (``closing(s)``, as in :func:`~pipeweave.auto.bounds.plan_bound`). Their
lengths add up to at least ``n_s L_s`` and at most ``K_s`` overlap, so::

    T  >=  max over (rank, stage s on it) of  head(s) + n_s L_s / K_s + closing(s)

At planning scale this is what a deep 1F1B pays where the transfers are as long as the
compute (1F1B keeps ``S - s`` micro-batches open on stage ``s``: 256 stages x 4 copies at
M = 8,192, bound 18.1 s, simulated 23.1 s, where the plan bound says 15.9 s), and V-Min's
third of the stages. Every term is a duration of the plan's costs, so recomputation (in the
costs) only raises it. No bound (0) where a program slices micro-batches (a Slicer half is
open with half the costs and its backward is whole) or runs several pipelines.
``tests/auto/test_window_bound.py`` checks it against the simulator on every synchronous
schedule and every candidate of a space, where a 5 % inflation fails.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..ir import Layout, Op, Schedule
from ..planner.plan import Plan
from ..schedules.flush_arrays import OPS, ArrayPrograms
from ..sim import StageCosts
from .fill_bound import WINDOWS

__all__ = ["Windows", "stage_windows", "window_bound", "declared_window_bound", "windows_bound"]



class Windows(NamedTuple):
    """Per (rank, stage) pair that runs forwards, four aligned arrays."""

    rank: np.ndarray
    stage: np.ndarray
    forwards: np.ndarray
    """``n``: the forwards of the stage on the rank."""
    most: np.ndarray
    """``K``: the most of them open at once."""
    reduces: bool
    """Whether the programs all-reduce (an all-reduce's cost counts only then)."""


_WINDOWS: dict[int, tuple[Schedule | ArrayPrograms, Windows | None]] = {}


def stage_windows(schedule: Schedule | ArrayPrograms) -> Windows | None:
    """``schedule``'s :data:`Windows`, as actions or as columns, remembered for the last
    schedules; None where a program slices micro-batches or runs several pipelines."""
    cached = _WINDOWS.get(id(schedule))
    if cached is not None and cached[0] is schedule:
        return cached[1]
    if len(_WINDOWS) > 16:
        _WINDOWS.clear()
    windows = _from_columns(schedule) if isinstance(schedule, ArrayPrograms) \
        else _from_actions(schedule)
    _WINDOWS[id(schedule)] = (schedule, windows)
    return windows


def _from_columns(programs: ArrayPrograms) -> Windows | None:
    if programs.piece is not None and programs.piece.any():
        return None  # Slicer halves, as _from_actions says
    rank = np.repeat(np.arange(programs.num_ranks), programs.lengths)
    step = np.zeros(len(OPS), dtype=np.int64)
    step[OPS.index(Op.FORWARD)] = 1
    step[[OPS.index(Op.BACKWARD), OPS.index(Op.BACKWARD_INPUT)]] = -1
    delta = step[programs.op]
    keep = delta != 0
    reduces = bool(np.any(programs.op == OPS.index(Op.ALL_REDUCE)))
    return _windows(rank[keep], programs.stage[keep], delta[keep], reduces)


def _from_actions(schedule: Schedule) -> Windows | None:
    ranks: list[int] = []
    stages: list[int] = []
    deltas: list[int] = []
    step = {Op.FORWARD: 1, Op.BACKWARD: -1, Op.BACKWARD_INPUT: -1}
    reduces = False
    for r, program in enumerate(schedule.programs):
        for action in program:
            if action.piece or action.pipeline:
                return None
            reduces = reduces or action.op == Op.ALL_REDUCE
            delta = step.get(action.op, 0)
            if delta:
                ranks.append(r)
                stages.append(action.stage)
                deltas.append(delta)
    return _windows(np.asarray(ranks, dtype=np.int64), np.asarray(stages, dtype=np.int64),
                    np.asarray(deltas, dtype=np.int64), reduces)


def _windows(rank: np.ndarray, stage: np.ndarray, delta: np.ndarray,
             reduces: bool) -> Windows:
    """Group the rank's forwards (+1) and gradient actions (-1) by (rank, stage) in program
    order; per group its forwards and its largest running count."""
    empty = np.zeros(0, dtype=np.int64)
    if len(rank) == 0:
        return Windows(empty, empty, empty, empty, reduces)
    key = rank * (int(stage.max()) + 1) + stage
    order = np.argsort(key, kind="stable")  # program order kept within a group
    key, delta = key[order], delta[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    running = np.cumsum(delta)
    before = np.r_[0, running[:-1]][starts]  # the running count where each group starts
    peak = np.maximum.reduceat(running, starts) - before
    forwards = np.add.reduceat((delta > 0).astype(np.int64), starts)
    rows = order[starts]
    has = forwards > 0
    return Windows(rank[rows][has], stage[rows][has], forwards[has], peak[has], reduces)


def window_bound(schedule: Schedule | ArrayPrograms, table: StageCosts, layout: Layout, *,
                 split: bool) -> float:
    """The largest over the (rank, stage) pairs of the bound above (0 where it does not
    apply); ``layout`` places the stages (a crossing within a rank costs nothing)."""
    windows = stage_windows(schedule)
    return 0.0 if windows is None else windows_bound(windows, table, layout, split=split)


def declared_window_bound(plan: Plan, table: StageCosts) -> float:
    """The same bound before the schedule is built, for a schedule of one stage per rank
    whose windows are declared (:data:`~pipeweave.auto.fill_bound.WINDOWS`: 1F1B keeps the
    ``k_s = min(n, S - s)`` forwards of its warm-up and its first steady one open, and no
    more after; ``tests/auto/test_window_bound.py`` checks them against the generated
    programs); 0 for the others, and with replicated stages, chunks, several pipelines,
    options or copies that share M unevenly."""
    stages = len(table.forward)
    if plan.schedule not in WINDOWS or plan.chunks != 1 or plan.replicas is not None \
            or plan.pipelines != 1 or plan.schedule_options or plan.microbatches % plan.width:
        return 0.0
    n = plan.microbatches // plan.width  # each copy's stage runs its share
    windows = WINDOWS[plan.schedule]
    most = np.array([windows(s, stages, n)[0] for s in range(stages)], dtype=np.int64)
    every = np.arange(stages)
    declared = Windows(every, every, np.full(stages, n), most, plan.width > 1)
    return windows_bound(declared, table, plan.layout(), split=False)


def windows_bound(windows: Windows, table: StageCosts, layout: Layout, *,
                  split: bool) -> float:
    """The bound above for these :data:`Windows` (0 for none)."""
    if len(windows.rank) == 0:
        return 0.0
    stage, n, most = windows.stage, windows.forwards, windows.most
    forward = np.asarray(table.forward, dtype=float)
    backward = np.asarray(table.backward, dtype=float)
    gradient = np.minimum(backward, table.input_grad) if split else backward
    places = layout.stage_ranks
    crossing = np.array([0.0 if set(places[s]) & set(places[s + 1])
                         else table.latency + table.transfer[s]
                         for s in range(len(forward) - 1)])
    down = np.zeros(len(forward))  # down[s]: the round trip behind s
    if len(crossing):
        trip = forward[1:] + gradient[1:] + 2.0 * crossing
        down[:-1] = np.cumsum(trip[::-1])[::-1]
    head = np.r_[0.0, np.cumsum(forward[:-1] + crossing)]
    closing = _closing(table, gradient, crossing, windows.reduces)
    length = forward + down + gradient
    chain = head[stage] + n * length[stage] / np.maximum(most, 1) + closing[stage]
    return float(chain.max())


def _closing(table: StageCosts, gradient: np.ndarray, crossing: np.ndarray,
             reduces: bool) -> np.ndarray:
    """Per stage ``s``: after its last gradient, the most of (its gradient's way back to a
    stage ``t <= s``, then ``t``'s all-reduce, where the programs all-reduce, and update)."""
    stages = len(gradient)
    closing = np.zeros(stages)
    running = 0.0
    for s in range(stages):
        own = (table.all_reduce[s] if reduces else 0.0) + table.update[s]
        running = max(own, running)
        closing[s] = running
        if s < stages - 1:
            running += gradient[s] + crossing[s]
    return closing
