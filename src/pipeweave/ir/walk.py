"""Timed execution of a schedule: the engine under the simulator and the validator.

Every rank runs its program in order; an action starts when the previous action of its rank
has finished and every dependency (from :func:`pipeweave.ir.deps.dependencies`) has finished,
plus the delay of the edge when the dependency ran elsewhere. A collective (``AR``) starts
when every rank that takes part has reached it. If no rank can move while programs remain,
the schedule deadlocks and :attr:`Walk.stuck` names each blocked rank's next action.

This is the longest-path computation over the DAG "program order + data dependencies",
done with a work list so the cost is linear in the number of actions.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable
from itertools import repeat
from dataclasses import dataclass

from .actions import CHECK_OPS, Action, Op
from .deps import collective_key, dependencies, ref
from .schedule import Schedule, render_grid

__all__ = ["Walk", "walk", "ScheduleError", "Location", "index_actions"]

Location = tuple[int, int]
"""``(rank, position)`` of an action in a schedule."""


class ScheduleError(ValueError):
    """A schedule is malformed or cannot run; the message includes the marked grid."""


@dataclass
class Walk:
    """Start/end of every action, or where execution got stuck."""

    start: list[list[float]]
    end: list[list[float]]
    binding: list[list[Location | None]]
    """For each action, the predecessor whose end fixed its start (None: time zero)."""
    stuck: list[Location]
    """Next action of each rank that could not proceed (empty when the walk completed)."""

    @property
    def deadlocked(self) -> bool:
        return bool(self.stuck)

    @property
    def makespan(self) -> float:
        return max((row[-1] for row in self.end if row), default=0.0)


DurationFn = Callable[[int, Action], float]
DelayFn = Callable[[Action, int, Action, int], float]
"""``delay(producer, producer_rank, consumer, consumer_rank)`` for cross-rank edges."""


def index_actions(schedule: Schedule) -> dict[Action, Location]:
    """Map each per-micro-batch action's :func:`ref` identity to its location.

    Duplicates are an error. Updates and collectives are per rank (each replica steps its own
    copy) and are not indexed; the halves of a global check (``C``, ``V``) are, by version.
    """
    # Built in bulk (this runs once per simulation over every action); the key is
    # ref(action), inlined. A duplicate shows up as a smaller dict than the number of keys,
    # and is then located by the slow loop below.
    index: dict[Action, Location] = {}
    new = tuple.__new__
    backward, backward_input = Op.BACKWARD, Op.BACKWARD_INPUT
    total = 0
    for rank, program in enumerate(schedule.programs):
        positions = [p for p, a in enumerate(program) if a[2] is not None]
        keys = [
            a if a[4] is None and a[5] == 0 and a[0] is not backward_input
            else new(Action, (backward if a[0] is backward_input else a[0], a[1], a[2], a[3],
                              None, 0, a[6]))
            for a in map(program.__getitem__, positions)
        ]
        index.update(zip(keys, zip(repeat(rank), positions)))
        total += len(keys)
        for position, action in enumerate(program):  # a global check's halves, by version
            if action[0] in CHECK_OPS:
                index[action.with_(lookahead=0)] = (rank, position)
                total += 1
    if len(index) != total:
        _raise_duplicate(schedule)
    return index


def _raise_duplicate(schedule: Schedule) -> None:
    seen: dict[Action, Location] = {}
    for rank, position, action in schedule.actions():
        if action.microbatch is None and action.op not in CHECK_OPS:
            continue
        key = ref(action)
        if key in seen:
            other = seen[key]
            raise ScheduleError(
                f"action {key} appears twice, at rank {other[0]} step {other[1]} and rank {rank} "
                f"step {position}; every action must be scheduled exactly once\n"
                + render_grid(schedule, marked=[other, (rank, position)])
            )
        seen[key] = (rank, position)
    raise AssertionError("index size mismatch without a duplicate")  # pragma: no cover


def walk(
    schedule: Schedule,
    duration: DurationFn,
    delay: DelayFn | None = None,
    index: dict[Action, Location] | None = None,
) -> Walk:
    """Time every action of ``schedule`` (see module docstring)."""
    programs = schedule.programs
    layout = schedule.layout
    lowered = schedule.lowered
    index = index_actions(schedule) if index is None else index
    all_reduce = Op.ALL_REDUCE
    participants: dict[object, int] = defaultdict(int)
    for program in programs:
        for action in program:
            if action[0] is all_reduce:
                participants[collective_key(action)] += 1

    n = len(programs)
    start = [[0.0] * len(p) for p in programs]
    end = [[0.0] * len(p) for p in programs]
    binding: list[list[Location | None]] = [[None] * len(p) for p in programs]
    # Ranks run their programs in order, so action (r, p) is done exactly when p < pointer[r].
    pointer = [0] * n
    clock = [0.0] * n
    # waiting[r][p]: ranks blocked until action (r, p) finishes.
    waiting: list[dict[int, list[int]]] = [{} for _ in range(n)]
    arrived: dict[object, list[Location]] = defaultdict(list)
    # A rank blocked on a dependency resumes where it stopped: (its dependencies, index of
    # the unfinished one, start so far, binding so far).
    pending: list[tuple[tuple[Action, ...], int, float, Location | None] | None] = [None] * n
    queue = deque(range(n))
    queued = [True] * n
    get = index.get

    def wake(rank: int, position: int) -> None:
        for waiter in waiting[rank].pop(position, ()):
            if not queued[waiter]:
                queued[waiter] = True
                queue.append(waiter)

    def finish(rank: int, position: int, t0: float, bind: Location | None) -> None:
        action = programs[rank][position]
        start[rank][position] = t0
        end[rank][position] = t1 = t0 + duration(rank, action)
        binding[rank][position] = bind
        clock[rank] = t1
        pointer[rank] = position + 1
        wake(rank, position)

    while queue:
        rank = queue.popleft()
        queued[rank] = False
        program = programs[rank]
        length = len(program)
        start_row, end_row, binding_row, waiting_row = (
            start[rank], end[rank], binding[rank], waiting[rank]
        )
        position = pointer[rank]
        resume = pending[rank]
        pending[rank] = None
        while position < length:
            action = program[position]
            if resume is not None:
                deps, first, t0, bind = resume
                resume = None
                todo = deps[first:]
            else:
                if action[0] is all_reduce:
                    key = collective_key(action)
                    group = arrived[key]
                    if (rank, position) not in group:
                        group.append((rank, position))
                    if len(group) < participants[key]:
                        break  # wait for the other replicas
                    latest = max(group, key=lambda loc: clock[loc[0]])
                    t_all = clock[latest[0]]
                    for other_rank, other_pos in group:
                        if other_rank != rank:
                            pointer[other_rank] = other_pos
                            finish(other_rank, other_pos, t_all, latest)
                            if not queued[other_rank]:
                                queued[other_rank] = True
                                queue.append(other_rank)
                    finish(rank, position, t_all, latest)
                    position += 1
                    continue
                t0 = clock[rank]
                bind = (rank, position - 1) if position else None
                todo = deps = dependencies(action, layout, lowered=lowered)
            for dep in todo:
                loc = get(dep)
                if loc is None:
                    raise ScheduleError(
                        f"rank {rank} step {position}: {action} depends on {dep}, which no rank "
                        f"schedules; add it (or lower the schedule so sends/receives exist)"
                    )
                dep_rank, dep_pos = loc
                if dep_pos >= pointer[dep_rank]:  # not finished yet: wait for it
                    waiting[dep_rank].setdefault(dep_pos, []).append(rank)
                    pending[rank] = (deps, len(deps) - len(todo) + todo.index(dep), t0, bind)
                    break
                ready = end[dep_rank][dep_pos]
                if dep_rank != rank and delay is not None:
                    ready += delay(programs[dep_rank][dep_pos], dep_rank, action, rank)
                if ready > t0:
                    t0, bind = ready, loc
            else:
                # every dependency is done: finish(rank, position, t0, bind), inlined
                start_row[position] = t0
                end_row[position] = t1 = t0 + duration(rank, action)
                binding_row[position] = bind
                clock[rank] = t1
                pointer[rank] = position + 1
                if waiting_row:
                    waiters = waiting_row.pop(position, None)
                    if waiters is not None:
                        for waiter in waiters:
                            if not queued[waiter]:
                                queued[waiter] = True
                                queue.append(waiter)
                position += 1
                continue
            break  # blocked on a dependency

    stuck = [(r, pointer[r]) for r in range(n) if pointer[r] < len(programs[r])]
    return Walk(start=start, end=end, binding=binding, stuck=stuck)
