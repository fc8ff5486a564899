"""Timing a schedule whose ranks share fewer CPU cores than there are ranks.

:func:`pipeweave.ir.walk` gives every rank its own device: an action takes its cost whatever
the other ranks do. Ranks launched as processes on one CPU machine with more ranks than cores
do not: the operating system shares the cores among the processes that have work, so an action
runs at full speed while at most ``cores`` ranks compute and slower when more do. Scaling every
cost by one factor (``ranks / cores``) gets that wrong both ways: a rank computing alone in a
bubble runs at full speed, and the bubble itself lets the others catch up.

:func:`walk_shared_cores` is the processor-sharing model of that machine, an event-driven
simulation over the same dependencies and program order as ``walk``:

* an action becomes ready when the previous action of its rank and every dependency have
  finished (plus the edge's delay across ranks), exactly as in ``walk``;
* between two events, the ``n`` compute actions in progress (forward, backward — whole or
  its ``I``/``W`` parts — optimizer step) each advance at rate ``min(1, cores / n)``: an
  action of cost ``c`` that shares the cores with others the whole time ends
  ``c * n / cores`` after it started;
* everything else (sends, receives, the all-reduce and averaging exchanges) takes its cost as
  wall time and uses no core of its own — it waits on the network, not the CPU;
* a rank that is not computing and has not finished its program (waiting for a message or
  for the other replicas of an all-reduce, or inside a send, receive or exchange) still takes
  ``waiting`` of a core (default 0): with ``n`` ranks computing and ``m`` waiting, the ``n``
  advance at rate ``min(1, cores / (n + waiting * m))``. A waiting rank process is not idle
  on a CPU machine: gloo's socket thread moves every message, our send thread posts each one,
  and a woken rank queues for a core (``benchmarks/waiting_cpu.py``: cnn's 4-stage pipeline
  on 4 ranks spent 34 ms of CPU per 29 ms iteration, 11.6 ms of it in those threads, against
  20.6 ms for the same work as 4 data-parallel copies). ``waiting`` comes from
  ``RuntimeCosts.wait_share``, which the calibration fits where it is told to
  (``pipeweave.measure.calibration_runs.WAITING``; by default it fits a cost per received
  message instead, ``compute_per_receive``).

With ``cores >= ranks`` it gives exactly ``walk``'s times, whatever ``waiting`` (``n + waiting
* m <= ranks <= cores`` for ``waiting <= 1``; the simulator walks there without this module). With one core and no communication
cost, a schedule that never deadlocks keeps the core busy from start to end, so its makespan is
the sum of every compute cost. Cost: every event scans the ranks, ``O(actions x ranks)``;
it is meant for the few ranks one CPU machine runs, not for the 64-stage benchmark.
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

from ..ir import CORE_OPS, Action, Op, Schedule, ScheduleError
from ..ir.deps import collective_key, dependencies
from ..ir.walk import (DelayFn, DurationFn, Location, Walk, collective_participants,
                       index_actions)
from .costs import check_number

__all__ = ["walk_shared_cores"]

_EPS = 1e-12
_INF = float("inf")


class _Ready(NamedTuple):
    """When a rank's next action may start, and the predecessor that fixed that time."""

    at: float
    binding: Location | None


class _Arrival(NamedTuple):
    """A rank that reached an all-reduce, waiting for the other replicas."""

    rank: int
    at: float
    binding: Location | None


def walk_shared_cores(
    schedule: Schedule,
    duration: DurationFn,
    delay: DelayFn | None = None,
    index: dict[Action, Location] | None = None,
    *,
    cores: int,
    waiting: float = 0.0,
) -> Walk:
    """Time every action of ``schedule`` on ``cores`` cores shared by all ranks, each rank
    that waits taking ``waiting`` of a core (module docstring).

    Raises:
        ValueError: if ``cores`` is not an integer >= 1, or ``waiting`` not a finite number
            >= 0.
        ScheduleError: if an action depends on one that no rank schedules.
    """
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise ValueError(f"cores must be an integer >= 1, got {cores!r}")
    share = check_number("waiting", waiting, meaning="the share of a core a waiting rank takes")
    index = index_actions(schedule) if index is None else index
    return _SharedCores(schedule, duration, delay, index, cores, share).run()


class _SharedCores:
    """The state of one :func:`walk_shared_cores`: which action each rank is at, whether it
    is in progress and how much of it is left, and the clock."""

    def __init__(self, schedule: Schedule, duration: DurationFn, delay: DelayFn | None,
                 index: dict[Action, Location], cores: int, waiting: float = 0.0) -> None:
        self.programs = programs = schedule.programs
        self.layout, self.lowered = schedule.layout, schedule.lowered
        self.duration, self.delay, self.index, self.cores = duration, delay, index, cores
        self.waiting = waiting
        self.participants = collective_participants(programs)
        n = len(programs)
        self.start = [[0.0] * len(p) for p in programs]
        self.end = [[0.0] * len(p) for p in programs]
        self.binding: list[list[Location | None]] = [[None] * len(p) for p in programs]
        self.pointer = [0] * n          # actions before pointer[r] have finished
        self.clock = [0.0] * n          # end of rank r's last finished action
        self.busy = [False] * n         # whether the action at pointer[r] is in progress
        self.remaining = [0.0] * n      # its work left (cost units at full speed, or wall time)
        self.computes = [False] * n     # whether it needs a core
        self.ready: list[_Ready | None] = [None] * n  # known future start
        self.arrived: dict[object, list[_Arrival]] = defaultdict(list)
        self.now = 0.0

    def run(self) -> Walk:
        while True:
            self._start_what_can_start()
            if not self._advance_clock():
                break
        programs, pointer = self.programs, self.pointer
        stuck = [(r, pointer[r]) for r in range(len(programs)) if pointer[r] < len(programs[r])]
        return Walk(start=self.start, end=self.end, binding=self.binding, stuck=stuck)

    def _start_what_can_start(self) -> None:
        """Start whatever can start by now; a zero-cost action finishing may free another."""
        moved = True
        while moved:
            moved = False
            for rank in range(len(self.programs)):
                if self.busy[rank] or self.pointer[rank] >= len(self.programs[rank]):
                    continue
                entry = self.ready[rank]
                if entry is None:
                    entry = self.ready[rank] = self._ready_time(rank)
                    if entry is None:
                        continue
                if entry.at > self.now + _EPS:
                    continue
                self.ready[rank] = None
                action = self.programs[rank][self.pointer[rank]]
                if action.op is Op.ALL_REDUCE:
                    self._arrive(rank, action, entry)
                else:
                    self._begin(rank, entry)
                moved = True

    def _arrive(self, rank: int, action: Action, entry: _Ready) -> None:
        """``rank`` reaches an all-reduce: parked until every replica has, then all begin it
        together at the latest arrival."""
        key = collective_key(action)
        group = self.arrived[key]
        group.append(_Arrival(rank, *entry))  # a parked rank is not scanned again
        if len(group) < self.participants[key]:
            self.ready[rank] = _Ready(_INF, entry.binding)  # parked until the group is complete
            return
        t_all, latest = max((a.at, (a.rank, self.pointer[a.rank])) for a in group)
        for other in group:
            self.ready[other.rank] = None
            self._begin(other.rank, _Ready(t_all, latest))
        del self.arrived[key]

    def _advance_clock(self) -> bool:
        """Move the clock to the next event (an action ends or a known start comes), sharing
        the cores among the compute actions in progress; False when nothing is left to do."""
        timers = [r.at for r in self.ready if r is not None and r.at != _INF]
        active = [r for r in range(len(self.programs)) if self.busy[r]]
        if not active and not timers:
            return False
        computes, remaining = self.computes, self.remaining
        computing = sum(computes[r] for r in active)
        rate = min(1.0, self.cores / (computing + self.waiting * self._waiting(computing))) \
            if computing else 1.0
        speed = [rate if computes[r] else 1.0 for r in active]
        step = max(0.0, min([remaining[r] / v for r, v in zip(active, speed)]
                            + [t - self.now for t in timers]))
        self.now += step
        for r, v in zip(active, speed):
            remaining[r] -= step * v
            if remaining[r] <= _EPS * max(1.0, self.now):
                self._finish(r, self.now)
        return True

    def _waiting(self, computing: int) -> int:
        """Ranks neither computing nor through their program (module docstring)."""
        if not self.waiting:
            return 0
        left = sum(p < len(program) for p, program in zip(self.pointer, self.programs))
        return left - computing

    def _finish(self, rank: int, at: float) -> None:
        self.end[rank][self.pointer[rank]] = at
        self.clock[rank] = at
        self.pointer[rank] += 1
        self.busy[rank] = False

    def _begin(self, rank: int, entry: _Ready) -> None:
        position = self.pointer[rank]
        action = self.programs[rank][position]
        self.start[rank][position] = entry.at
        self.binding[rank][position] = entry.binding
        cost = self.duration(rank, action)
        if cost <= 0.0:
            self._finish(rank, entry.at)
        else:
            self.busy[rank], self.remaining[rank] = True, cost
            self.computes[rank] = action.op in CORE_OPS

    def _ready_time(self, rank: int) -> _Ready | None:
        """When the next action of ``rank`` may start, or None while a dependency runs."""
        position = self.pointer[rank]
        action = self.programs[rank][position]
        t0, bind = self.clock[rank], ((rank, position - 1) if position else None)
        for dep in dependencies(action, self.layout, lowered=self.lowered):
            loc = self.index.get(dep)
            if loc is None:
                raise ScheduleError(
                    f"rank {rank} step {position}: {action} depends on {dep}, which no rank "
                    f"schedules; add it (or lower the schedule so sends/receives exist)")
            dep_rank, dep_pos = loc
            if dep_pos >= self.pointer[dep_rank]:
                return None
            t = self.end[dep_rank][dep_pos]
            if dep_rank != rank and self.delay is not None:
                t += self.delay(self.programs[dep_rank][dep_pos], dep_rank, action, rank)
            if t > t0:
                t0, bind = t, loc
        return _Ready(t0, bind)
