"""Where a rank's program can stop and resume: iteration boundaries, and the hooks run there.

The checkpoint "after step ``k``" is, on each rank, the point of its program after which no
action of iterations ``< k`` remains and before which no action of iteration ``k`` ran
(:func:`iteration_boundaries`). Synchronous (flush) schedules have one after every step;
asynchronous ones only where they drain (:func:`clean_boundaries`, :mod:`.drain`; see
:mod:`.recovery` for why).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from ...ir import Action, Op, Schedule
from ...schedules import get_info
from ..job import Job
from .drain import check_drained, check_prediction

__all__ = ["Hooks", "combine_hooks", "clean_boundaries", "iteration_boundaries",
           "check_checkpointable", "check_resume_point"]

Hooks = Mapping[int, Callable[[], None]]
"""``position -> callable`` run right after the action at ``position`` of a rank's program."""


def combine_hooks(*maps: Hooks) -> dict[int, Callable[[], None]]:
    """One hook map; hooks at the same position run in the order the maps are given."""
    lists: dict[int, list[Callable[[], None]]] = {}
    for hooks in maps:
        for position, hook in hooks.items():
            lists.setdefault(position, []).append(hook)
    return {p: (fs[0] if len(fs) == 1 else _chain(fs)) for p, fs in lists.items()}


def _chain(hooks: list[Callable[[], None]]) -> Callable[[], None]:
    def run_all() -> None:
        for hook in hooks:
            hook()
    return run_all


_UPDATE_OPS = (Op.STEP, Op.ALL_REDUCE, Op.AVERAGE, Op.CHECK, Op.VALIDATE)
"""Actions of update ``v`` (which ends iteration ``v - 1`` of a flush schedule)."""


def _iterations(schedule: Schedule, program: Sequence[Action]) -> list[int]:
    """The iteration each action of ``program`` belongs to. An update without a micro-batch
    belongs to the iteration of the backward before it on an asynchronous schedule (its
    version counts updates, several per iteration), to iteration ``version - 1`` on a flush
    schedule (whose update ``k+1`` ends iteration ``k``)."""
    found, previous = [], 0
    for action in program:
        if action.microbatch is not None:
            previous = action.microbatch // schedule.microbatches
            found.append(previous)
        elif not schedule.synchronous:
            found.append(previous)
        elif action.op in _UPDATE_OPS and action.version is not None:
            found.append(action.version - 1)
        else:
            raise ValueError(f"{action}: cannot tell which iteration it belongs to")
    return found


def clean_boundaries(schedule: Schedule, rank: int) -> dict[int, int]:
    """``{k: cut}`` for every iteration ``k`` after which ``rank``'s program has a clean cut:
    its first ``cut`` actions are those of iterations ``<= k`` (the checkpoint after step
    ``k + 1``). Every ``k`` for a flush schedule; for an asynchronous one the drains
    (option ``drain``) and the end."""
    program = schedule.programs[rank]
    iterations = schedule.iterations
    last = [-1] * iterations
    first = [len(program)] * iterations
    for position, k in enumerate(_iterations(schedule, program)):
        if not 0 <= k < iterations:
            raise ValueError(f"schedule {schedule.name!r}: {program[position]} on rank {rank} is "
                             f"not part of one of its {iterations} iterations the way a flush "
                             f"schedule's update is; there are no checkpoint boundaries")
        last[k] = max(last[k], position)
        first[k] = min(first[k], position)
    cuts, done = [], -1
    for k in range(iterations):
        done = max(done, last[k])
        cuts.append(done + 1)
    clean, later = {iterations - 1: cuts[-1]}, len(program)  # earliest action of iterations > k
    for k in range(iterations - 2, -1, -1):
        later = min(later, first[k + 1])
        if later >= cuts[k]:
            clean[k] = cuts[k]
    return dict(sorted(clean.items()))


def iteration_boundaries(schedule: Schedule, rank: int) -> list[int]:
    """``cut[k]``: how many leading actions of ``rank``'s program belong to iterations ``<= k``.

    Raises ValueError when some action of a later iteration comes before the end of an
    earlier one (no clean boundary: an asynchronous schedule without a drain there).
    """
    clean = clean_boundaries(schedule, rank)
    for k in range(schedule.iterations):
        if k not in clean:
            program = schedule.programs[rank]
            owner = _iterations(schedule, program)
            later = next(p for p, i in enumerate(owner) if i > k)
            raise ValueError(
                f"schedule {schedule.name!r}: on rank {rank}, {program[later]} (iteration "
                f"{owner[later]}) runs before iteration {k} ends; "
                f"there is no checkpoint boundary after step {k + 1}")
    return [clean[k] for k in range(schedule.iterations)]


def check_checkpointable(job: Job, schedule: Schedule,
                         ranks: Iterable[int] | None = None) -> None:
    """Reject checkpoint/resume settings the schedule cannot honour, naming the fix.

    ``ranks``: whose programs to check for boundaries (default: all).
    """
    options = job.checkpoint
    if options is None or (options.directory is None and options.resume is None):
        return
    if not get_info(job.plan.schedule).checkpointable:
        raise ValueError(
            f"checkpoint/resume: schedule {schedule.name!r} declares it cannot stop and resume "
            f"exactly (its registry entry's checkpointable); run it without "
            f"--checkpoint-dir/--checkpoint-every/--resume")
    ranks = range(schedule.num_ranks) if ranks is None else ranks
    checked = any(a.op is Op.CHECK for program in schedule.programs for a in program)
    if schedule.synchronous and not checked:
        for rank in ranks:
            iteration_boundaries(schedule, rank)
        return
    # asynchronous schedules, and zb-h2's post-validation: only where they drain
    total = schedule.iterations
    clean = set.intersection(*(set(clean_boundaries(schedule, r)) for r in ranks))
    check_drained(job, schedule, [k + 1 for k in range(total)
                                  if options.writes_after(k + 1, total) and k not in clean])
    check_prediction(job, schedule)


def check_resume_point(schedule: Schedule, step: int, ranks: Iterable[int] | None = None) -> None:
    """Refuse resuming after ``step`` where ``schedule`` has no clean boundary (an
    asynchronous schedule that does not drain there)."""
    ranks = range(schedule.num_ranks) if ranks is None else ranks
    if all(step - 1 in clean_boundaries(schedule, r) for r in ranks):
        return
    every = schedule.options.get("drain")
    raise ValueError(
        f"the checkpoint is after step {step}, but {schedule.name!r} "
        + (f"drains every {every} steps here" if every else "does not drain there")
        + f", so no rank can start there; resume with --checkpoint-every (or --option drain) "
        f"set to a divisor of {step}, e.g. the one the checkpoint was written with")
