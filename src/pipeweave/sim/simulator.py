"""The discrete-event simulator: time a schedule with per-action costs and measure it.

It is the longest-path walk of :func:`pipeweave.ir.walk` (program order on each rank plus the
data dependencies of :func:`pipeweave.ir.deps.dependencies`) with these rules:

* a forward/backward takes its stage's cost (a Slicer half: its half cost, by default half
  of it, :mod:`pipeweave.sim.halves`), a split backward's
  ``I`` the backward less its weight-gradient part and ``W`` that part
  (:class:`pipeweave.sim.Costs`), ``U``/``AR``/``AV`` their update/all-reduce/averaging costs;
* sends are asynchronous (the sender moves on at once) and a receive completes at the
  send's end plus the transfer time. Lowering a compute-only schedule therefore adds nothing
  but that delay on each cross-rank edge, so a compute-only schedule is walked directly with
  the delay on its cross-rank edges, which is equivalent and several times faster::

      rank0  F0 ──────┐                        F0 ─ SF0 ───────┐
                  +C  │        ==                       +C     │
      rank1           └── F0                     RF0 ──────────┴── F0

  A lowered schedule (with sends/receives) is walked as it is, with zero-cost sends and
  receives and the transfer time on the send -> receive edge.
* an all-reduce starts when every replica has reached it;
* with ``Costs(shared_cores=c)`` and more ranks than ``c``, the ranks' compute shares the
  cores (:mod:`pipeweave.sim.shared_cores`, an event-driven processor-sharing walk).

:func:`simulate` returns a :class:`SimulationResult` with the timeline and the measures of
:mod:`pipeweave.sim.metrics` and :mod:`pipeweave.sim.critical_path`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

from ..collector import paused_collection
from ..ir import CHECK_OPS, Action, Op, Schedule, ScheduleError, render_grid, walk
from ..ir.walk import DelayFn, DurationFn, Location, Walk, index_actions
from . import metrics
from .compiled import compiled_for
from .costs import Costs, StageCosts
from .critical_path import critical_path, master_stage
from .halves import half_tables, sliced_keys
from .shared_cores import walk_shared_cores

__all__ = ["TimelineRecord", "SimulationResult", "simulate", "Timing", "simulate_timing",
           "PathTiming", "simulate_path"]


class TimelineRecord(NamedTuple):
    """One timed action: the plain record the Chrome-trace and plot exports take.

    The runtime's measured timelines use the same four fields (times in seconds there).
    """

    rank: int
    action: str
    start: float
    end: float


@dataclass(frozen=True)
class SimulationResult:
    """What :func:`simulate` predicts for one schedule.

    Attributes:
        schedule: the schedule simulated.
        costs: the costs, expanded per stage.
        start, end: ``start[r][i]`` / ``end[r][i]``: times of action ``i`` of rank ``r``.
        makespan: end of the last action.
        iteration_time: time per iteration (see :mod:`pipeweave.sim.metrics`).
        window: the interval the iteration time and bubble are measured over.
        busy: compute time (F, B, I, W) of each rank inside ``window``.
        bubble_fraction: ``1 - sum(busy) / (ranks x window)``.
        peak_activations: per rank, most activations held at once (halves count 0.5); an
            activation is held from its forward until its weight gradient (``B`` or ``W``).
        peak_activation_bytes: per rank, most activation bytes held at once.
        weight_versions: per stage, most weight versions one copy of the stage holds.
        critical_path_locations: ``(rank, position)`` of each critical-path action.
        master_stage: the stage the critical path follows through the steady phase.
    """

    schedule: Schedule
    costs: StageCosts
    start: list[list[float]] = field(repr=False)
    end: list[list[float]] = field(repr=False)
    makespan: float
    iteration_time: float
    window: tuple[float, float]
    busy: list[float]
    bubble_fraction: float
    peak_activations: list[float]
    peak_activation_bytes: list[float]
    weight_versions: list[int]
    critical_path_locations: list[Location] = field(repr=False)
    master_stage: int

    @property
    def critical_path(self) -> list[Action]:
        """The critical-path actions, first forward first."""
        return [self.schedule.programs[r][p] for r, p in self.critical_path_locations]

    @cached_property
    def timeline(self) -> list[TimelineRecord]:
        """Every action as ``(rank, action text, start, end)``, rank by rank in program order."""
        return [
            TimelineRecord(rank, str(action), t0, t1)
            for rank, (program, starts, ends) in enumerate(
                zip(self.schedule.programs, self.start, self.end)
            )
            for action, t0, t1 in zip(program, starts, ends)
        ]

    def summary(self) -> dict[str, object]:
        """The measures as plain JSON-able data (what ``pipeweave simulate --json`` prints)."""
        s = self.schedule
        return {
            "schedule": s.name,
            "stages": s.num_stages,
            "ranks": s.num_ranks,
            "microbatches": s.microbatches,
            "iterations": s.iterations,
            "pipelines": s.pipelines,
            "synchronous": s.synchronous,
            "makespan": self.makespan,
            "iteration_time": self.iteration_time,
            "window": list(self.window),
            "bubble_fraction": self.bubble_fraction,
            "peak_activations": list(self.peak_activations),
            "peak_activation_bytes": list(self.peak_activation_bytes),
            "weight_versions": list(self.weight_versions),
            "critical_path": [str(a) for a in self.critical_path],
            "master_stage": self.master_stage,
        }


def simulate(schedule: Schedule, costs: Costs | None = None, *,
             keep_predicted: bool = False) -> SimulationResult:
    """Time ``schedule`` with ``costs`` (default: F=1, B=2, no communication) and measure it.

    ``keep_predicted``: predicted weights are kept from a forward to its backward
    (PipeOptim's ``backward="graph"``), which changes the weight versions counted.

    Raises:
        ScheduleError: (a ``ValueError``) if the schedule deadlocks — the message holds the
            rank-by-step grid with each blocked rank's next action marked ``>x<`` — or if an
            action is scheduled twice or waits for one that no rank runs.
        ValueError: if ``costs`` do not match the schedule's stages.
    """
    table = (costs if costs is not None else Costs()).resolve(schedule.num_stages)
    with paused_collection():
        return _simulate(schedule, table, keep_predicted)


@dataclass(frozen=True)
class Timing:
    """What :func:`simulate_timing` measures: :class:`SimulationResult`'s timing fields."""

    makespan: float
    iteration_time: float
    window: tuple[float, float]
    bubble_fraction: float


def simulate_timing(schedule: Schedule, costs: Costs | None = None, *,
                    index: dict[Action, Location] | None = None) -> Timing:
    """:func:`simulate`'s makespan, iteration time, window and bubble fraction, and nothing
    else: no critical path, held activations or weight versions, which a search that ranks
    thousands of candidates by time does not read (a third of :func:`simulate`'s cost at
    scale). The same walk, so the same numbers. ``index``: :func:`index_actions` of
    ``schedule``, when a caller times one schedule under many costs."""
    table = (costs if costs is not None else Costs()).resolve(schedule.num_stages)
    with paused_collection():
        timing = _walk(schedule, table, index_actions(schedule) if index is None else index)
        iteration_time, window = metrics.iteration_window(schedule, timing.end, timing.makespan)
        busy = metrics.busy_time(schedule, timing.start, timing.end,
                                 None if window == (0.0, timing.makespan) else window)
    return Timing(makespan=timing.makespan, iteration_time=iteration_time, window=window,
                  bubble_fraction=metrics.bubble_fraction(busy, window))


class PathTiming(NamedTuple):
    """What :func:`simulate_path` measures: :class:`SimulationResult`'s iteration time and
    master stage."""

    iteration_time: float
    master_stage: int


def simulate_path(schedule: Schedule, costs: Costs | None = None, *,
                  index: dict[Action, Location] | None = None) -> PathTiming:
    """:func:`simulate`'s iteration time and master stage (the critical path's heaviest
    stage), without the held activations and weight versions AutoPipe's search does not read
    (half of :func:`simulate`'s cost at 64+ stages); ``index`` as for
    :func:`simulate_timing`. The same walk and path, so the same numbers."""
    table = (costs if costs is not None else Costs()).resolve(schedule.num_stages)
    index = index_actions(schedule) if index is None else index
    with paused_collection():
        timing = _walk(schedule, table, index)
        iteration_time, _ = metrics.iteration_window(schedule, timing.end, timing.makespan)
        path = critical_path(schedule, timing.start, timing.end, index, _delay_fn(table))
        return PathTiming(iteration_time, master_stage(schedule, path, timing.start, timing.end))


def _walk(schedule: Schedule, table: StageCosts, index: dict[Action, Location]) -> Walk:
    """The timed walk (shared cores or not); a deadlock raises."""
    duration = _duration_fn(table, schedule)
    delay = _delay_fn(table)
    cores = table.shared_cores
    if cores is not None and cores < schedule.num_ranks:
        timing = walk_shared_cores(schedule, duration, delay, index, cores=cores,
                                   waiting=table.wait_share)
    elif (compiled := compiled_for(schedule, index)) is not None:
        start, end = compiled.times(table)  # the same walk, vectorised (sim/compiled.py)
        return Walk(start=compiled.rows(start), end=compiled.rows(end),
                    binding=[[None] * n for n in compiled.lengths], stuck=[])
    else:
        timing = walk(schedule, duration, delay, index=index)
    if timing.deadlocked:
        raise _deadlock_error(schedule, timing.stuck)
    return timing


def _simulate(schedule: Schedule, table: StageCosts, keep_predicted: bool) -> SimulationResult:
    index = index_actions(schedule)
    delay = _delay_fn(table)
    timing = _walk(schedule, table, index)
    start, end = timing.start, timing.end
    makespan = timing.makespan
    iteration_time, window = metrics.iteration_window(schedule, end, makespan)
    busy = metrics.busy_time(schedule, start, end, None if window == (0.0, makespan) else window)
    held, held_bytes = metrics.peak_activations(schedule, table)
    path = critical_path(schedule, start, end, index, delay)
    return SimulationResult(
        schedule=schedule,
        costs=table,
        start=start,
        end=end,
        makespan=makespan,
        iteration_time=iteration_time,
        window=window,
        busy=busy,
        bubble_fraction=metrics.bubble_fraction(busy, window),
        peak_activations=held,
        peak_activation_bytes=held_bytes,
        weight_versions=metrics.weight_versions(schedule, keep_predicted=keep_predicted),
        critical_path_locations=path,
        master_stage=master_stage(schedule, path, start, end),
    )


def _duration_fn(costs: StageCosts, schedule: Schedule | None = None) -> DurationFn:
    """Each action's duration; ``schedule`` is needed with half costs given (which
    micro-batches it slices)."""
    by_op: dict[Op, tuple[float, ...]] = {
        Op.FORWARD: costs.forward,
        Op.BACKWARD: costs.backward,
        Op.BACKWARD_INPUT: costs.input_grad,
        Op.BACKWARD_WEIGHT: costs.weight_grad,
        Op.STEP: costs.update,
        Op.ALL_REDUCE: costs.all_reduce,
        Op.AVERAGE: costs.average,
    }
    zero = (0.0,) * len(costs.forward)
    table = {op: by_op.get(op, zero) for op in Op}

    def duration(_rank: int, action: Action) -> float:
        t = table[action.op][action.stage]
        return t * 0.5 if action.piece else t  # a Slicer half costs half

    return _priced_halves(costs, schedule, table) if costs.explicit_halves else duration


def _priced_halves(costs: StageCosts, schedule: Schedule | None,
                   table: dict[Op, tuple[float, ...]]) -> DurationFn:
    """Durations with the given half costs (:mod:`pipeweave.sim.halves`)."""
    assert schedule is not None, "half costs are priced per schedule: pass the schedule"
    halves, sliced = half_tables(costs), sliced_keys(schedule.programs)

    def duration(_rank: int, action: Action) -> float:
        half = halves.get(action.op)
        if half is None:
            t = table[action.op][action.stage]
            return t * 0.5 if action.piece else t
        if action.piece:
            return half[action.stage]
        if (action.stage, action.microbatch, action.pipeline) in sliced:
            return 2 * half[action.stage]  # one backward per half (StageRuntime.backward)
        return table[action.op][action.stage]

    return duration


def _delay_fn(costs: StageCosts) -> DelayFn | None:
    if costs.latency == 0 and not any(costs.transfer):
        return None
    latency, transfer = costs.latency, costs.transfer

    def delay(producer: Action, _from_rank: int, consumer: Action, _to_rank: int) -> float:
        if producer.op in CHECK_OPS:  # a global check's state: a few numbers
            return latency
        # boundary between stages b and b+1; the gradient crosses it the other way
        t = transfer[min(producer.stage, consumer.stage)]
        return latency + (t * 0.5 if producer.piece else t)

    return delay


def _deadlock_error(schedule: Schedule, stuck: list[Location]) -> ScheduleError:
    waits = ", ".join(f"rank {r} at step {p} ({schedule.programs[r][p]})" for r, p in stuck)
    columns = max(p for _, p in stuck) + 3
    grid = render_grid(schedule, marked=stuck, max_columns=max(columns, 16))
    return ScheduleError(
        f"schedule {schedule.name!r} deadlocks: no rank can proceed; blocked: {waits}. Each "
        "blocked action waits for one that another blocked rank only runs later: reorder those "
        f"ranks' programs (the blocked actions are marked >x<)\n{grid}"
    )
