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
  wall time and uses no core — it waits on the network, not the CPU.

With ``cores >= ranks`` it gives exactly ``walk``'s times. With one core and no communication
cost, a schedule that never deadlocks keeps the core busy from start to end, so its makespan is
the sum of every compute cost. Cost: every event scans the ranks, ``O(actions x ranks)``;
it is meant for the few ranks one CPU machine runs, not for the 64-stage benchmark.
"""

from __future__ import annotations

from collections import defaultdict

from ..ir import Action, Op, Schedule, ScheduleError
from ..ir.deps import collective_key, dependencies
from ..ir.walk import DelayFn, DurationFn, Location, Walk, index_actions

__all__ = ["walk_shared_cores", "COMPUTE_OPS"]

COMPUTE_OPS = frozenset({Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT, Op.STEP})
"""Actions that need a core; the others wait on the network."""

_EPS = 1e-12


def walk_shared_cores(
    schedule: Schedule,
    duration: DurationFn,
    delay: DelayFn | None = None,
    index: dict[Action, Location] | None = None,
    *,
    cores: int,
) -> Walk:
    """Time every action of ``schedule`` on ``cores`` cores shared by all ranks.

    Raises:
        ValueError: if ``cores`` is not an integer >= 1.
        ScheduleError: if an action depends on one that no rank schedules.
    """
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise ValueError(f"cores must be an integer >= 1, got {cores!r}")
    programs = schedule.programs
    layout, lowered = schedule.layout, schedule.lowered
    index = index_actions(schedule) if index is None else index
    n = len(programs)
    participants: dict[object, int] = defaultdict(int)
    for program in programs:
        for action in program:
            if action.op is Op.ALL_REDUCE:
                participants[collective_key(action)] += 1

    start = [[0.0] * len(p) for p in programs]
    end = [[0.0] * len(p) for p in programs]
    binding: list[list[Location | None]] = [[None] * len(p) for p in programs]
    pointer = [0] * n          # actions before pointer[r] have finished
    clock = [0.0] * n          # end of rank r's last finished action
    busy = [False] * n         # whether the action at pointer[r] is in progress
    remaining = [0.0] * n      # its work left (cost units at full speed, or wall time)
    computes = [False] * n     # whether it needs a core
    ready: list[tuple[float, Location | None] | None] = [None] * n  # known future start
    arrived: dict[object, list[tuple[int, float, Location | None]]] = defaultdict(list)
    now = 0.0

    def finish(rank: int, at: float) -> None:
        end[rank][pointer[rank]] = at
        clock[rank] = at
        pointer[rank] += 1
        busy[rank] = False

    def begin(rank: int, t0: float, bind: Location | None) -> None:
        position = pointer[rank]
        action = programs[rank][position]
        start[rank][position] = t0
        binding[rank][position] = bind
        cost = duration(rank, action)
        if cost <= 0.0:
            finish(rank, t0)
        else:
            busy[rank], remaining[rank] = True, cost
            computes[rank] = action.op in COMPUTE_OPS

    def ready_time(rank: int) -> tuple[float, Location | None] | None:
        """When the next action of ``rank`` may start, or None while a dependency runs."""
        position = pointer[rank]
        action = programs[rank][position]
        t0, bind = clock[rank], ((rank, position - 1) if position else None)
        for dep in dependencies(action, layout, lowered=lowered):
            loc = index.get(dep)
            if loc is None:
                raise ScheduleError(
                    f"rank {rank} step {position}: {action} depends on {dep}, which no rank "
                    f"schedules; add it (or lower the schedule so sends/receives exist)")
            dep_rank, dep_pos = loc
            if dep_pos >= pointer[dep_rank]:
                return None
            t = end[dep_rank][dep_pos]
            if dep_rank != rank and delay is not None:
                t += delay(programs[dep_rank][dep_pos], dep_rank, action, rank)
            if t > t0:
                t0, bind = t, loc
        return t0, bind

    while True:
        # Start whatever can start by now; a zero-cost action finishing may free another.
        moved = True
        while moved:
            moved = False
            for rank in range(n):
                if busy[rank] or pointer[rank] >= len(programs[rank]):
                    continue
                entry = ready[rank]
                if entry is None:
                    entry = ready[rank] = ready_time(rank)
                    if entry is None:
                        continue
                t0, bind = entry
                if t0 > now + _EPS:
                    continue
                ready[rank] = None
                action = programs[rank][pointer[rank]]
                if action.op is Op.ALL_REDUCE:
                    key = collective_key(action)
                    group = arrived[key]
                    group.append((rank, t0, bind))  # a parked rank is not scanned again
                    if len(group) < participants[key]:
                        ready[rank] = (float("inf"), bind)  # parked until the group is complete
                        continue
                    t_all, latest = max((t, (r, pointer[r])) for r, t, _ in group)
                    for other, _, _ in group:
                        ready[other] = None
                        begin(other, t_all, latest)
                    del arrived[key]
                else:
                    begin(rank, t0, bind)
                moved = True

        timers = [r[0] for r in ready if r is not None and r[0] != float("inf")]
        active = [r for r in range(n) if busy[r]]
        if not active and not timers:
            break
        computing = sum(computes[r] for r in active)
        rate = min(1.0, cores / computing) if computing else 1.0
        speed = [rate if computes[r] else 1.0 for r in active]
        step = max(0.0, min([remaining[r] / v for r, v in zip(active, speed)]
                            + [t - now for t in timers]))
        now += step
        for r, v in zip(active, speed):
            remaining[r] -= step * v
            if remaining[r] <= _EPS * max(1.0, now):
                finish(r, now)

    stuck = [(r, pointer[r]) for r in range(n) if pointer[r] < len(programs[r])]
    return Walk(start=start, end=end, binding=binding, stuck=stuck)
