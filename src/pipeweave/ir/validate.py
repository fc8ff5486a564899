"""Validator: proves a schedule is complete, well-placed, version-correct and deadlock-free.

Checks, in order (each failure raises :class:`ScheduleError` with the grid, the offending
cells marked ``>x<``):

1. placement — every per-micro-batch action runs on the rank the layout routes it to;
2. completeness — every (pipeline, stage, micro-batch) has exactly one forward (whole, or both
   Slicer halves) and exactly one backward, per iteration;
3. same-rank order — a dependency on the same rank comes earlier; a backward comes after its
   own forward (the activation it needs is stashed there);
4. weight versions — updates on a stage number 1, 2, 3, ... in program order; a forward uses a
   version that exists; a backward uses a version that exists and, by the *exact* rule,
   targets the version its forward targeted, i.e.
   ``B.version + B.lookahead == F.version + F.lookahead`` (stashing: both lookaheads 0;
   PipeOptim: the backward runs on the current weights, ``F.version + F.lookahead``;
   SpecTrain: the backward predicts ``B.lookahead`` further from the current weights).
   A schedule built with a fixed look-ahead (option ``lookahead``: PipeOptim's ablation)
   predicts approximately by design, so for it the *current-weights* rule replaces the exact
   one: every backward has ``B.lookahead == 0`` and ``B.version`` equal to the number of
   updates of its stage and pipeline that precede it in the program;
5. liveness — a unit-cost walk finishes (no deadlock); in a lowered schedule every send has
   exactly one receive.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from .actions import Action, Op
from .deps import dependencies, ref
from .schedule import Schedule, render_grid
from .walk import Location, ScheduleError, index_actions, walk

__all__ = ["validate", "ScheduleError"]


def validate(schedule: Schedule) -> None:
    """Raise :class:`ScheduleError` if ``schedule`` breaks any rule (see module docstring)."""
    _check_placement(schedule)
    index = index_actions(schedule)
    _check_completeness(schedule, index)
    _check_order(schedule, index)
    _check_versions(schedule)
    _check_liveness(schedule, index)


def _fail(schedule: Schedule, message: str, marked: list[Location]) -> ScheduleError:
    grid = render_grid(schedule, marked=marked, max_columns=64)
    return ScheduleError(f"{schedule.name}: {message}\n{grid}")


def _check_placement(schedule: Schedule) -> None:
    layout = schedule.layout
    for rank, position, action in schedule.actions():
        if action.stage >= layout.num_stages:
            raise _fail(schedule, f"{action} names stage {action.stage} but there are only "
                        f"{layout.num_stages} stages", [(rank, position)])
        if action.pipeline >= schedule.pipelines:
            raise _fail(schedule, f"{action} names pipeline {action.pipeline} but the schedule has "
                        f"{schedule.pipelines}", [(rank, position)])
        if action.microbatch is not None:
            expected = layout.rank_of(action.stage, action.microbatch)
        else:
            expected = rank if rank in layout.stage_ranks[action.stage] else -1
        if expected != rank:
            raise _fail(schedule, f"{action} is on rank {rank} but the layout routes it to rank "
                        f"{expected}", [(rank, position)])


def _check_completeness(schedule: Schedule, index: dict[Action, Location]) -> None:
    total = schedule.microbatches * schedule.iterations
    for p in range(schedule.pipelines):
        for s in range(schedule.num_stages):
            for j in range(total):
                whole = Action(Op.FORWARD, s, j, pipeline=p) in index
                halves = [Action(Op.FORWARD, s, j, h, pipeline=p) in index for h in (1, 2)]
                if whole == any(halves) or (any(halves) and not all(halves)):
                    raise _fail(schedule, f"stage {s} micro-batch {j} pipeline {p} needs exactly one "
                                "forward (whole, or both halves a and b)", [])
                if Action(Op.BACKWARD, s, j, pipeline=p) not in index:
                    raise _fail(schedule, f"stage {s} micro-batch {j} pipeline {p} has no backward", [])
    expected = schedule.pipelines * schedule.num_stages * total
    backwards = sum(1 for _, _, a in schedule.actions() if a.op is Op.BACKWARD)
    if backwards != expected:
        raise _fail(schedule, f"{backwards} backwards scheduled, expected {expected} "
                    f"(pipelines x stages x microbatches x iterations)", [])


def _check_order(schedule: Schedule, index: dict[Action, Location]) -> None:
    for rank, position, action in schedule.actions():
        required = list(dependencies(action, schedule.layout, lowered=schedule.lowered))
        if action.op is Op.BACKWARD:
            required += [f for h in (0, 1, 2)
                         if (f := Action(Op.FORWARD, action.stage, action.microbatch, h,
                                         pipeline=action.pipeline)) in index]
        for dep in required:
            loc = index.get(dep)
            if loc is not None and loc[0] == rank and loc[1] > position:
                raise _fail(schedule, f"{action} at step {position} needs {dep}, which rank {rank} "
                            f"only runs later at step {loc[1]}", [(rank, position), loc])


def _check_versions(schedule: Schedule) -> None:
    """Rule 4: the exact rule, or the current-weights rule for a fixed ``lookahead`` option."""
    current_weights = schedule.options.get("lookahead") is not None
    forward_target: dict[Action, int] = {}
    for rank, program in enumerate(schedule.programs):
        updates: Counter[tuple[int, int]] = Counter()
        for position, action in enumerate(program):
            key = (action.stage, action.pipeline)
            where = [(rank, position)]
            if action.op is Op.STEP:
                updates[key] += 1
                if action.version is not None and action.version != updates[key]:
                    raise _fail(schedule, f"{action} is update number {updates[key]} of stage "
                                f"{action.stage}; versions must count 1, 2, 3, ...", where)
            elif action.op is Op.FORWARD and action.version is not None:
                if action.version > updates[key]:
                    raise _fail(schedule, f"{action} uses version {action.version} but only "
                                f"{updates[key]} updates have happened", where)
                forward_target[ref(action)] = action.version + action.lookahead
            elif action.op is Op.BACKWARD and action.version is not None:
                if current_weights:
                    _check_backward_current(schedule, action, updates[key], where)
                else:
                    _check_backward_exact(schedule, action, forward_target, where)
                if action.version > updates[key]:
                    raise _fail(schedule, f"{action} uses version {action.version} which does not "
                                "exist yet", where)


def _check_backward_exact(schedule: Schedule, backward: Action, forward_target: dict[Action, int],
                          where: list[Location]) -> None:
    """The backward targets the version its forward targeted (stashing, exact prediction)."""
    assert backward.version is not None
    wanted = {v for f in _forwards_of(backward) if (v := forward_target.get(ref(f))) is not None}
    if wanted and wanted != {backward.version + backward.lookahead}:
        raise _fail(schedule, f"{backward} must target version {sorted(wanted)} (its forward's "
                    "version plus lookahead) with its own version plus lookahead", where)


def _check_backward_current(schedule: Schedule, backward: Action, updates: int,
                            where: list[Location]) -> None:
    """The backward runs at its stage's current weights (a fixed, approximate look-ahead)."""
    if backward.version != updates or backward.lookahead:
        raise _fail(schedule, f"{backward} must run at the current weights, version {updates} with "
                    f"no lookahead (the count of stage {backward.stage}'s updates before it): the "
                    f"forwards predict a fixed lookahead={schedule.options['lookahead']!r}, "
                    f"approximate by design, so the backward takes the weights as they are; "
                    f"tag it {backward.with_(version=updates, lookahead=0)}", where)


def _forwards_of(backward: Action) -> list[Action]:
    return [Action(Op.FORWARD, backward.stage, backward.microbatch, h, pipeline=backward.pipeline)
            for h in (0, 1, 2)]


def _check_liveness(schedule: Schedule, index: dict[Action, Location]) -> None:
    if schedule.lowered:
        receivers: defaultdict[Action, int] = defaultdict(int)
        for _, _, action in schedule.actions():
            if action.op in (Op.RECV_ACT, Op.RECV_GRAD):
                for dep in dependencies(action, schedule.layout, lowered=True):
                    receivers[dep] += 1
        for rank, position, action in schedule.actions():
            if action.op in (Op.SEND_ACT, Op.SEND_GRAD) and receivers[ref(action)] != 1:
                raise _fail(schedule, f"{action} has {receivers[ref(action)]} matching receives; "
                            "it needs exactly one", [(rank, position)])
    result = walk(schedule, lambda _rank, action: 1.0 if action.is_compute else 0.0, index=index)
    if result.deadlocked:
        stuck = ", ".join(f"rank {r}: {schedule.programs[r][p]}" for r, p in result.stuck)
        raise _fail(schedule, f"deadlock: no rank can proceed ({stuck})", result.stuck)
