"""Validator: proves a schedule is complete, well-placed, version-correct and deadlock-free.

Checks, in order (each failure raises :class:`ScheduleError` with the grid, the offending
cells marked ``>x<``):

1. placement — every per-micro-batch action runs on the rank the layout routes it to;
2. completeness — every (pipeline, stage, micro-batch) has exactly one forward (whole, or both
   Slicer halves) and exactly one backward: a whole ``B``, or its two parts ``I`` (input
   gradient) and ``W`` (weight gradient), per iteration;
3. same-rank order — a dependency on the same rank comes earlier; a backward (``B`` or ``I``)
   comes after its own forward (the activation it needs is stashed there), a ``W`` after its
   ``I`` (which leaves it the graph and the gradients it needs);
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
   ``I`` and ``W`` follow the backward's rules, and a ``W`` uses its ``I``'s version;
5. updates — in a synchronous schedule every weight gradient (``B`` or ``W``) of iteration
   ``k`` lands in update ``k + 1`` of its stage: it runs after that rank's ``k`` earlier
   updates of the stage and before the next (asynchronous schedules define which update a
   gradient joins by this same program order, :mod:`.updates`);
6. liveness — a unit-cost walk finishes (no deadlock); in a lowered schedule every send has
   exactly one receive;
7. global check (``C``/``V``, :mod:`pipeweave.schedules.global_check`), when a schedule has
   one — each stage sits on one rank, and for every update ``U(s)@v`` of the stage there is
   exactly one ``C(s)@v`` and one ``V(s)@v`` on its rank; the ``C`` comes after every weight
   gradient the update consumes and before the update; the ``V`` comes after the ``C`` and
   either before the update (the check completes first) or after it, with nothing between
   the update and the ``V`` but forwards of the next iteration and their messages (what the
   runtime redoes when the check undoes the update: no gradient, update or check of the
   stage's can be among them), and before the stage's next ``C``.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from .actions import CHECK_OPS, GRADIENT_OPS, WEIGHT_GRADIENT_OPS, Action, Op
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
    if schedule.synchronous:
        _check_updates(schedule)
    if any(a.op in CHECK_OPS for _, _, a in schedule.actions()):
        _check_global_check(schedule)
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
                _check_one_backward(schedule, index, s, j, p)
    expected = schedule.pipelines * schedule.num_stages * total
    backwards = sum(1 for _, _, a in schedule.actions() if a.op in GRADIENT_OPS)
    if backwards != expected:
        raise _fail(schedule, f"{backwards} backwards scheduled, expected {expected} "
                    f"(pipelines x stages x microbatches x iterations)", [])


def _check_one_backward(schedule: Schedule, index: dict[Action, Location], s: int, j: int,
                        p: int) -> None:
    """A whole ``B``, or an ``I`` and a ``W`` (the index knows an ``I`` by ``B``'s identity)."""
    where = f"stage {s} micro-batch {j} pipeline {p}"
    found = index.get(Action(Op.BACKWARD, s, j, pipeline=p))
    weight = index.get(Action(Op.BACKWARD_WEIGHT, s, j, pipeline=p))
    if found is None:
        raise _fail(schedule, f"{where} has no backward (B, or I and W)",
                    [weight] if weight is not None else [])
    split = schedule.programs[found[0]][found[1]].op is Op.BACKWARD_INPUT
    if split and weight is None:
        raise _fail(schedule, f"{where} has an input-gradient backward I but no weight-gradient "
                    "W; add the W (or use one B)", [found])
    if not split and weight is not None:
        raise _fail(schedule, f"{where} has a whole backward B and a W; a backward is either B "
                    "or I and W", [found, weight])


def _check_order(schedule: Schedule, index: dict[Action, Location]) -> None:
    for rank, position, action in schedule.actions():
        required = list(dependencies(action, schedule.layout, lowered=schedule.lowered))
        if action.op is Op.BACKWARD_WEIGHT:
            required.append(Action(Op.BACKWARD, action.stage, action.microbatch,
                                   pipeline=action.pipeline))  # its I, by B's identity
        if action.op in GRADIENT_OPS:
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
    input_version: dict[Action, int] = {}
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
            elif action.op is Op.BACKWARD_WEIGHT:
                _check_weight_version(schedule, action, input_version, where)
            elif action.op in GRADIENT_OPS and action.version is not None:
                input_version[ref(action)] = action.version
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


def _check_weight_version(schedule: Schedule, weight: Action, input_version: dict[Action, int],
                          where: list[Location]) -> None:
    """A ``W`` differentiates the graph its ``I`` did: the same version, no look-ahead of its own."""
    wanted = input_version.get(ref(weight._replace(op=Op.BACKWARD)))
    if weight.version != wanted or weight.lookahead:
        raise _fail(schedule, f"{weight} must carry its I's version ({wanted}) and no lookahead: "
                    f"it finishes the backward the I began", where)


def _check_updates(schedule: Schedule) -> None:
    """Rule 5: a weight gradient of iteration k runs after k updates of its stage and before
    the all-reduce (replicas) and the update that consume it (rank-local)."""
    for rank, program in enumerate(schedule.programs):
        updates: Counter[tuple[int, int]] = Counter()
        reduced: Counter[tuple[int, int]] = Counter()
        for position, action in enumerate(program):
            key = (action.stage, action.pipeline)
            if action.op is Op.STEP:
                updates[key] += 1
            elif action.op is Op.ALL_REDUCE:
                reduced[key] += 1
            elif action.op in WEIGHT_GRADIENT_OPS and action.microbatch is not None:
                iteration = action.microbatch // schedule.microbatches
                if updates[key] != iteration or reduced[key] > iteration:
                    late = "the all-reduce" if updates[key] == iteration else f"{updates[key]} updates"
                    raise _fail(schedule, f"{action} is a weight gradient of iteration {iteration} "
                                f"but runs after {late} of stage {action.stage} on rank {rank}; "
                                f"it must land in update {iteration + 1} (after {iteration} "
                                f"updates, before the next and its all-reduce)", [(rank, position)])


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


_SPECULATIVE = frozenset({Op.FORWARD, Op.SEND_ACT, Op.RECV_ACT})
"""What may run between an update and its post-validation (redone if the check undoes it)."""


def _check_global_check(schedule: Schedule) -> None:
    """Rule 7 (module docstring)."""
    layout = schedule.layout
    if any(len(ranks) != 1 for ranks in layout.stage_ranks):
        raise _fail(schedule, "a global check (C, V) needs every stage on one rank (no "
                    "replicas, width 1)", [])
    for rank, program in enumerate(schedule.programs):
        where: dict[tuple[Op, int, int | None], int] = {}
        for position, action in enumerate(program):
            if action.op in CHECK_OPS or action.op is Op.STEP:
                key = (action.op, action.stage, action.version)
                if key in where:
                    raise _fail(schedule, f"{action} appears twice on rank {rank}",
                                [(rank, where[key]), (rank, position)])
                where[key] = position
        for (op, stage, version), step in where.items():
            if op is not Op.STEP:
                continue
            check = where.get((Op.CHECK, stage, version))
            valid = where.get((Op.VALIDATE, stage, version))
            update = program[step]
            if check is None or valid is None:
                raise _fail(schedule, f"{update} has no {'C' if check is None else 'V'}@{version} "
                            f"of stage {stage} on rank {rank}; a checked schedule checks every "
                            "update", [(rank, step)])
            _check_one_global_check(schedule, rank, program, check, step, valid)
        for (op, stage, version), position in where.items():
            if op in CHECK_OPS and (Op.STEP, stage, version) not in where:
                raise _fail(schedule, f"{program[position]} checks an update the stage never "
                            "makes", [(rank, position)])


def _check_one_global_check(schedule: Schedule, rank: int, program: tuple[Action, ...],
                            check: int, step: int, valid: int) -> None:
    update = program[step]
    stage, version = update.stage, update.version
    assert version is not None
    for position, action in enumerate(program):
        if (action.op in WEIGHT_GRADIENT_OPS and action.stage == stage
                and action.microbatch is not None
                and action.microbatch // schedule.microbatches == version - 1 and position > check):
            raise _fail(schedule, f"{action} runs after {program[check]}: the check must see every "
                        "gradient its update consumes", [(rank, position), (rank, check)])
    if not check < step:
        raise _fail(schedule, f"{program[check]} must come before {update}",
                    [(rank, check), (rank, step)])
    if not check < valid:
        raise _fail(schedule, f"{program[valid]} must come after {program[check]} (the state "
                    "goes down the stages and back)", [(rank, check), (rank, valid)])
    if valid > step:
        for position in range(step + 1, valid):
            action = program[position]
            if action.op not in _SPECULATIVE or action.microbatch is None or (
                    action.microbatch // schedule.microbatches != version):
                raise _fail(schedule, f"{action} runs between {update} and its validation "
                            f"{program[valid]}; only forwards of iteration {version} (and their "
                            "messages) may, since a failed check redoes them",
                            [(rank, position), (rank, valid)])
    following = [p for p, a in enumerate(program)
                 if a.op is Op.CHECK and a.stage == stage and a.version == version + 1]
    if following and following[0] < valid:
        raise _fail(schedule, f"{program[valid]} must come before the next check "
                    f"{program[following[0]]}", [(rank, valid), (rank, following[0])])
