"""Critical path and master stage of a timed schedule (AutoPipe §III-B).

AutoPipe treats every forward and backward as an edge of an AOE network weighted by its time;
the critical path is the longest path from the first forward to the end of the last backward.
Several paths can be equally long: in the 1F1B phase a path may hop between stages that are
equally loaded (Fig. 4). AutoPipe keeps "the one closest to the last pipeline stage in the
1F1B phase", and calls the stage that path follows through the 1F1B phase the master stage::

    stage0  F0 F1 F2 F3 .  .  .  B0 F4 B1 F5 B2 ... B7        path: F0 on stages 0..3,
    stage1  .  F0 F1 F2 .  .  B0 F3 B1 F4 ...                       then along stage 3 through
    stage2  .  .  F0 F1 .  B0 F2 B1 F3 ...                          its steady phase (master),
    stage3  .  .  .  F0 B0 F1 B1 F2 B2 F3 ... F7 B7                 then B7 on stages 3..0.

We reconstruct it from the timed walk: an edge into an action is *tight* when the
predecessor's end (plus the transfer delay across ranks) equals the action's start, so every
chain of tight edges back from the last backward is a longest path. Walking back from the end
of the last backward we always take the tight predecessor on the highest stage, and between
equal stages the same rank's previous action: among equally long paths this keeps the one
nearest the last stage. A split backward's ``I`` and ``W`` are edges like ``B``: a ``W`` is
reached from its rank's previous action only (no other stage waits for it). The master stage
is the stage holding the most compute time on that path (ties: the later stage), which in a
1F1B schedule is the stage the path follows through the steady phase.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import NamedTuple

from ..ir import COMPUTE_OPS, Action, Op, Schedule, collective_key, dependencies
from ..ir.walk import DelayFn, Location

__all__ = ["critical_path", "master_stage"]

_COMPUTE = COMPUTE_OPS
"""F, B and a split backward's I and W: the edges of AutoPipe's AOE network."""


def critical_path(
    schedule: Schedule,
    start: list[list[float]],
    end: list[list[float]],
    index: dict[Action, Location],
    delay: DelayFn | None = None,
) -> list[Location]:
    """Locations of the critical path, first action first (see module docstring).

    Args:
        schedule: the timed schedule.
        start, end: times of every action, as :func:`pipeweave.ir.walk` gives them.
        index: :func:`pipeweave.ir.walk.index_actions` of ``schedule``.
        delay: the cross-rank delay the walk used (None: no delay).
    """
    last = _last_compute(schedule.programs, end)
    if last is None:
        return []
    groups: dict[object, list[Location]] | None = None
    path = [last]
    while True:
        rank, position = path[-1]
        if groups is None and schedule.programs[rank][position].op is Op.ALL_REDUCE:
            groups = _collective_groups(schedule)
        node = _binding_predecessor(schedule, path[-1], start, end, index, delay, groups)
        if node is None:  # starts at time zero
            break
        path.append(node)
    path.reverse()
    return path


def _last_compute(programs: Sequence[Sequence[Action]], end: list[list[float]]) -> Location | None:
    """The last backward (B, or W of a split one): a rank runs its program in order, so its
    latest-ending compute action is its last one; the latest of those (ties: the lower stage,
    then the lower rank). None when no rank computes."""
    last: Location | None = None
    best: tuple[float, int] | None = None
    for rank, program in enumerate(programs):
        for position in range(len(program) - 1, -1, -1):
            action = program[position]
            if action.op in _COMPUTE:
                key = (end[rank][position], -action.stage)
                if best is None or key > best:
                    last, best = (rank, position), key
                break
    return last


class _Candidate(NamedTuple):
    """A predecessor that ends when an action starts; the path follows the greatest."""

    stage: int
    same_rank: int
    """1 for the previous action of the same rank, 0 for a dependency (ties: the same rank)."""
    location: Location


def _binding_predecessor(schedule: Schedule, node: Location, start: list[list[float]],
                         end: list[list[float]], index: dict[Action, Location],
                         delay: DelayFn | None,
                         groups: dict[object, list[Location]] | None) -> Location | None:
    """The predecessor of ``node`` whose end fixed its start (None: it starts at time zero)."""
    programs = schedule.programs
    rank, position = node
    action = programs[rank][position]
    t0 = start[rank][position]
    tolerance = 1e-9 * max(1.0, abs(t0))
    candidates: list[_Candidate] = []
    if action.op is Op.ALL_REDUCE:
        assert groups is not None
        previous = [(r, p - 1) for r, p in groups[collective_key(action)] if p > 0]
    else:
        previous = [(rank, position - 1)] if position > 0 else []
        for dep in dependencies(action, schedule.layout, lowered=schedule.lowered):
            dep_rank, dep_pos = loc = index[dep]
            ready = end[dep_rank][dep_pos]
            if dep_rank != rank and delay is not None:
                ready += delay(programs[dep_rank][dep_pos], dep_rank, action, rank)
            if ready >= t0 - tolerance:
                candidates.append(_Candidate(programs[dep_rank][dep_pos].stage, 0, loc))
    for prev_rank, prev_pos in previous:
        if end[prev_rank][prev_pos] >= t0 - tolerance:
            candidates.append(_Candidate(programs[prev_rank][prev_pos].stage, 1,
                                         (prev_rank, prev_pos)))
    return max(candidates).location if candidates else None


def master_stage(schedule: Schedule, path: list[Location], start: list[list[float]],
                 end: list[list[float]]) -> int:
    """The stage with the most compute (F, B, I, W) time on ``path`` (ties: the later stage)."""
    load: dict[int, float] = defaultdict(float)
    for rank, position in path:
        action = schedule.programs[rank][position]
        if action.op in _COMPUTE:
            load[action.stage] += end[rank][position] - start[rank][position]
    if not load:
        return 0
    return max(load, key=lambda stage: (load[stage], stage))


def _collective_groups(schedule: Schedule) -> dict[object, list[Location]]:
    groups: dict[object, list[Location]] = defaultdict(list)
    for rank, position, action in schedule.actions():
        key = collective_key(action)
        if key is not None:
            groups[key].append((rank, position))
    return groups
