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

import weakref
from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import NamedTuple

from .actions import CHECK_OPS, Action, Op
from .deps import collective_key, dependencies, ref
from .schedule import Schedule, render_grid

__all__ = ["Walk", "walk", "ScheduleError", "Location", "index_actions", "collective_participants"]

Location = tuple[int, int]
"""``(rank, position)`` of an action in a schedule."""

_ALL_REDUCE = Op.ALL_REDUCE
_new = tuple.__new__
"""A named tuple's own ``__new__`` without its extra call (as :class:`Action` does)."""


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


INDEX_CACHE_SIZE = 8
"""Schedules whose index :func:`index_actions` keeps (by identity: schedules are immutable)."""

_indexes: OrderedDict[int, tuple[weakref.ref[Schedule], dict[Action, Location]]] = OrderedDict()


def index_actions(schedule: Schedule) -> dict[Action, Location]:
    """Map each per-micro-batch action's :func:`ref` identity to its location.

    Duplicates are an error. Updates and collectives are per rank (each replica steps its own
    copy) and are not indexed; the halves of a global check (``C``, ``V``) are, by version.
    The index of each of the last :data:`INDEX_CACHE_SIZE` schedules is kept and shared
    while the schedule lives (AutoPipe asks it of one 1F1B for every search at that shape):
    callers must not change it.
    """
    key = id(schedule)
    hit = _indexes.get(key)
    if hit is not None and hit[0]() is schedule:
        _indexes.move_to_end(key)
        return hit[1]
    index = _index(schedule)
    _indexes[key] = (weakref.ref(schedule, lambda _dead: _forget(key)), index)
    while len(_indexes) > INDEX_CACHE_SIZE:
        _indexes.popitem(last=False)
    return index


def _forget(key: int) -> None:
    """Drop a dead schedule's index at once (it holds millions of actions at scale)."""
    hit = _indexes.get(key)
    if hit is not None and hit[0]() is None:
        del _indexes[key]


def _index(schedule: Schedule) -> dict[Action, Location]:
    # Built in bulk (this runs once per simulation over every action); the key is
    # ref(action), inlined. A duplicate shows up as a smaller dict than the number of keys,
    # and is then located by the slow loop below.
    index: dict[Action, Location] = {}
    new = tuple.__new__
    backward, backward_input = Op.BACKWARD, Op.BACKWARD_INPUT
    total = 0
    for rank, program in enumerate(schedule.programs):
        positions = [p for p, a in enumerate(program) if a.microbatch is not None]
        keys = [
            a if a.version is None and a.lookahead == 0 and a.op is not backward_input
            else new(Action, (backward if a.op is backward_input else a.op, a.stage, a.microbatch,
                              a.piece, None, 0, a.pipeline))
            for a in map(program.__getitem__, positions)
        ]
        index.update(zip(keys, zip(repeat(rank), positions)))
        total += len(keys)
        for position, action in enumerate(program):  # a global check's halves, by version
            if action.op in CHECK_OPS:
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
    index = index_actions(schedule) if index is None else index
    return _Walker(schedule, duration, delay, index).run()


def collective_participants(programs: Sequence[Sequence[Action]]) -> dict[object, int]:
    """How many ranks take part in each collective (``AR``), by :func:`collective_key`."""
    participants: dict[object, int] = defaultdict(int)
    all_reduce = Op.ALL_REDUCE
    for program in programs:
        for action in program:
            if action.op is all_reduce:
                participants[collective_key(action)] += 1
    return participants


class _Resume(NamedTuple):
    """Where a rank blocked on a dependency resumes."""

    deps: tuple[Action, ...]
    """The dependencies of its next action."""
    first: int
    """Index in ``deps`` of the one it waits for (those before it are done)."""
    start: float
    """The start so far (the latest end among the finished dependencies)."""
    binding: Location | None
    """The predecessor that fixed that start."""


class _Walker:
    """The state of one :func:`walk`: a work list of ranks that may move.

    Ranks run their programs in order, so action ``(r, p)`` is done exactly when
    ``p < pointer[r]``; ``waiting[r][p]`` lists the ranks blocked until ``(r, p)`` finishes.
    """

    def __init__(self, schedule: Schedule, duration: DurationFn, delay: DelayFn | None,
                 index: dict[Action, Location]) -> None:
        self.programs = programs = schedule.programs
        self.layout, self.lowered = schedule.layout, schedule.lowered
        self.duration, self.delay, self.get = duration, delay, index.get
        self.participants = collective_participants(programs)
        n = len(programs)
        self.start = [[0.0] * len(p) for p in programs]
        self.end = [[0.0] * len(p) for p in programs]
        self.binding: list[list[Location | None]] = [[None] * len(p) for p in programs]
        self.pointer = [0] * n
        self.clock = [0.0] * n
        self.waiting: list[dict[int, list[int]]] = [{} for _ in range(n)]
        self.arrived: dict[object, list[Location]] = defaultdict(list)
        self.pending: list[_Resume | None] = [None] * n
        self.queue = deque(range(n))
        self.queued = [True] * n

    def run(self) -> Walk:
        queue, queued, advance = self.queue, self.queued, self._advance
        while queue:
            rank = queue.popleft()
            queued[rank] = False
            advance(rank)
        programs, pointer = self.programs, self.pointer
        stuck = [(r, pointer[r]) for r in range(len(programs)) if pointer[r] < len(programs[r])]
        return Walk(start=self.start, end=self.end, binding=self.binding, stuck=stuck)

    def _advance(self, rank: int) -> None:
        """Run ``rank``'s program until it ends or waits (on a dependency or a collective).

        Its loop runs once per action of the schedule: the dependency scan and the finish are
        inlined (a method call each would cost a third of the walk's time)."""
        program, duration, delay, get = self.programs[rank], self.duration, self.delay, self.get
        start_row, end_row, binding_row = self.start[rank], self.end[rank], self.binding[rank]
        waiting_row, clock, pointer, end = self.waiting[rank], self.clock, self.pointer, self.end
        queue, queued = self.queue, self.queued
        position, resume = pointer[rank], self.pending[rank]
        self.pending[rank] = None
        while position < len(program):
            action = program[position]
            if resume is not None:
                deps, first, t0, bind = resume
                resume = None
            elif action.op is _ALL_REDUCE:
                if not self._collective(rank, position, action):
                    return  # wait for the other replicas
                position += 1
                continue
            else:
                deps, first = dependencies(action, self.layout, lowered=self.lowered), 0
                t0, bind = clock[rank], ((rank, position - 1) if position else None)
            for dep in (deps[first:] if first else deps):
                loc = get(dep)
                if loc is None:
                    raise _missing(rank, position, action, dep)
                dep_rank, dep_pos = loc
                if dep_pos >= pointer[dep_rank]:  # not finished yet: wait for it
                    self.waiting[dep_rank].setdefault(dep_pos, []).append(rank)
                    self.pending[rank] = _new(_Resume, (deps, deps.index(dep, first), t0, bind))
                    return
                ready = end[dep_rank][dep_pos]
                if dep_rank != rank and delay is not None:
                    ready += delay(self.programs[dep_rank][dep_pos], dep_rank, action, rank)
                if ready > t0:
                    t0, bind = ready, loc
            # every dependency is done: self._finish(rank, position, t0, bind), inlined
            start_row[position], binding_row[position] = t0, bind
            end_row[position] = clock[rank] = t0 + duration(rank, action)
            pointer[rank] = position + 1
            if waiting_row and position in waiting_row:
                for waiter in waiting_row.pop(position):  # self._enqueue(waiter), inlined
                    if not queued[waiter]:
                        queued[waiter] = True
                        queue.append(waiter)
            position += 1

    def _collective(self, rank: int, position: int, action: Action) -> bool:
        """``rank`` reaches an all-reduce: True once every replica has (all finish it together,
        when the last one arrives), False while it waits for the others."""
        key = collective_key(action)
        group = self.arrived[key]
        if (rank, position) not in group:
            group.append((rank, position))
        if len(group) < self.participants[key]:
            return False
        clock = self.clock
        latest = max(group, key=lambda loc: clock[loc[0]])
        t_all = clock[latest[0]]
        for other_rank, other_pos in group:
            if other_rank != rank:
                self.pointer[other_rank] = other_pos
                self._finish(other_rank, other_pos, t_all, latest)
                self._enqueue(other_rank)
        self._finish(rank, position, t_all, latest)
        return True

    def _finish(self, rank: int, position: int, t0: float, bind: Location | None) -> None:
        self.start[rank][position] = t0
        self.end[rank][position] = t1 = t0 + self.duration(rank, self.programs[rank][position])
        self.binding[rank][position] = bind
        self.clock[rank] = t1
        self.pointer[rank] = position + 1
        for waiter in self.waiting[rank].pop(position, ()):
            self._enqueue(waiter)

    def _enqueue(self, rank: int) -> None:
        if not self.queued[rank]:
            self.queued[rank] = True
            self.queue.append(rank)


def _missing(rank: int, position: int, action: Action, dep: Action) -> ScheduleError:
    return ScheduleError(
        f"rank {rank} step {position}: {action} depends on {dep}, which no rank "
        f"schedules; add it (or lower the schedule so sends/receives exist)"
    )
