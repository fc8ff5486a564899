"""Whether a schedule can keep one parameter exact whose copies sit on several stages.

A parameter several blocks share (tied word embeddings) becomes a copy per holding stage when
a plan splits those blocks; the runtime sums the copies' gradients before each update
(``runtime/execution/ties.py`` says how and why). That is exact only when every copy sees the
same weights and each update of every holder consumes the same micro-batches. The rules are
read off the schedule's actions, here, without torch, so the runtime (before it starts
anything) and ``pipeweave auto`` (before it proposes a plan) ask the same function:

- no optimistic update checked afterwards (zero-bubble's ``post_validation``): it checks the
  gradients before any sum;
- the holding stages have the same number of replicas (sums go replica by replica);
- nothing predicted (``lookahead``): each copy would be predicted from its own gradient;
- every micro-batch's forward, and its backward, runs at one weight version on every holder;
- the holders' n-th updates consume the same micro-batches;
- on every rank, every weight gradient of a holding stage runs before the rank's first ``AR``
  or ``U`` of its update (:func:`update_sum_positions`), where the sum happens.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Sequence

from .actions import CHECK_OPS, WEIGHT_GRADIENT_OPS, Action, Op
from .schedule import Schedule

__all__ = ["gradient_after_its_sum", "tie_refusal", "update_sum_positions"]


def update_sum_positions(program: Sequence[Action]) -> dict[int, tuple[int, int]]:
    """Position -> (update version, pipeline) of a rank's first ``AR`` or ``U`` of each update:
    where the runtime sums a tie's copies' gradients."""
    seen: set[tuple[int, int]] = set()
    found: dict[int, tuple[int, int]] = {}
    for position, action in enumerate(program):
        if action.op in (Op.ALL_REDUCE, Op.STEP) and action.version is not None:
            key = (action.version, action.pipeline)
            if key not in seen:
                seen.add(key)
                found[position] = key
    return found


def tie_refusal(stages: Collection[int], schedule: Schedule) -> str | None:
    """Why ``schedule`` cannot keep one parameter held on ``stages`` exact, in one clause
    naming the schedule (module docstring); ``None`` when it can. Give the lowered schedule
    the runtime runs (``ir.lower``)."""
    holders = set(stages)
    name = schedule.name
    if any(a.op in CHECK_OPS for program in schedule.programs for a in program):
        return (f"schedule {name!r} checks the gradients globally after an optimistic update "
                f"(post_validation), which does not sum a tie's copies yet; drop "
                f"post_validation (a flushed zb-h2 keeps the tie exact)")
    replicas = {schedule.layout.replicas(s) for s in holders}
    if len(replicas) > 1:
        return (f"those stages are replicated {sorted(replicas)} times: the copies' gradients "
                f"are summed replica by replica, so give them the same number of replicas")
    versions: dict[tuple[Op, int, int], dict[int, int | None]] = defaultdict(dict)
    consumed: dict[tuple[int, int], list[set[int]]] = {}
    for program in schedule.programs:
        pending: dict[tuple[int, int], set[int]] = defaultdict(set)
        updates: dict[tuple[int, int], int] = defaultdict(int)
        for action in program:
            if action.stage not in holders:
                continue
            if action.lookahead:
                return (f"schedule {name!r} predicts weights ({action} looks "
                        f"{action.lookahead} update(s) ahead), so the copies would be predicted "
                        f"from different gradients and see different weights")
            if action.is_compute:
                assert action.microbatch is not None
                op = Op.BACKWARD if action.op in WEIGHT_GRADIENT_OPS | {Op.BACKWARD_INPUT} \
                    else Op.FORWARD
                versions[(op, action.microbatch, action.pipeline)][action.stage] = action.version
                if action.op in WEIGHT_GRADIENT_OPS:
                    pending[(action.stage, action.pipeline)].add(action.microbatch)
            elif action.op is Op.STEP:
                key = (action.stage, action.pipeline)
                sets = consumed.setdefault(key, [])
                if updates[key] == len(sets):
                    sets.append(set())
                sets[updates[key]] |= pending.pop(key, set())
                updates[key] += 1
    for (op, microbatch, _), per_stage in sorted(versions.items(), key=lambda kv: kv[0][1:]):
        if len(set(per_stage.values())) > 1:
            seen = ", ".join(f"version {v} on stage {s}" for s, v in sorted(per_stage.items()))
            what = "forward" if op is Op.FORWARD else "backward"
            return (f"schedule {name!r} runs the {what} of micro-batch {microbatch} at {seen}, "
                    f"so the two copies of the tied parameter would see different weight "
                    f"versions")
    for pipeline in range(schedule.pipelines):
        orders = {tuple(frozenset(u) for u in consumed.get((s, pipeline), [])) for s in holders}
        if len(orders) > 1:
            return (f"schedule {name!r} updates those stages after different micro-batches, so "
                    f"the copies' gradients cannot be summed per update")
    for rank, program in enumerate(schedule.programs):
        late = gradient_after_its_sum(program, holders & set(schedule.layout.stages_of(rank)))
        if late is not None:
            return f"schedule {name!r}: rank {rank} {late}"
    return None


def gradient_after_its_sum(program: Sequence[Action], holding: set[int]) -> str | None:
    """A weight gradient of a holding stage after the sum its update uses, described (``None``:
    every one comes before); ``holding``: the stages of a tie on this rank."""
    if not holding:
        return None
    first = {key: position for position, key in update_sum_positions(program).items()}
    last_step: dict[tuple[int, int], int] = {}
    for position, action in enumerate(program):
        if action.stage not in holding:
            continue
        if action.op is Op.STEP and action.version is not None:
            last_step[(action.stage, action.pipeline)] = action.version
        elif action.op in WEIGHT_GRADIENT_OPS:
            update = last_step.get((action.stage, action.pipeline), 0) + 1
            sums = first.get((update, action.pipeline))
            if sums is not None and position > sums:
                return (f"runs {action} after its first update action {program[sums]} of that "
                        f"update, where the tied copies' gradients are summed")
    return None
