"""Where a rank's program can stop and resume: iteration boundaries, and the hooks run there.

The checkpoint "after step ``k``" is, on each rank, the point of its program after which no
action of iterations ``< k`` remains and before which no action of iteration ``k`` ran
(:func:`iteration_boundaries`); only synchronous (flush) schedules have such points
(:func:`check_checkpointable`; see :mod:`.recovery` for why).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from ...ir import Action, Op, Schedule
from ...schedules import get_info
from ..job import Job

__all__ = ["Hooks", "combine_hooks", "iteration_boundaries", "check_checkpointable"]

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


def _iteration_of(action: Action, microbatches: int) -> int:
    if action.microbatch is not None:
        return action.microbatch // microbatches
    if action.op in (Op.STEP, Op.ALL_REDUCE, Op.AVERAGE) and action.version is not None:
        return action.version - 1  # a flush schedule's update (and AV) k+1 ends iteration k
    raise ValueError(f"{action}: cannot tell which iteration it belongs to")


def iteration_boundaries(schedule: Schedule, rank: int) -> list[int]:
    """``cut[k]``: how many leading actions of ``rank``'s program belong to iterations ``<= k``.

    Raises ValueError when some action of a later iteration comes before the end of an
    earlier one (no clean boundary: an asynchronous schedule).
    """
    program = schedule.programs[rank]
    iterations = schedule.iterations
    last = [-1] * iterations
    first = [len(program)] * iterations
    for position, action in enumerate(program):
        k = _iteration_of(action, schedule.microbatches)
        if not 0 <= k < iterations:
            raise ValueError(f"schedule {schedule.name!r}: {action} on rank {rank} is not part of "
                             f"one of its {iterations} iterations the way a flush schedule's "
                             f"update is; there are no checkpoint boundaries")
        last[k] = max(last[k], position)
        first[k] = min(first[k], position)
    cuts, done = [], -1
    for k in range(iterations):
        done = max(done, last[k])
        cuts.append(done + 1)
    later = len(program)  # earliest position of any iteration > k
    for k in range(iterations - 2, -1, -1):
        later = min(later, first[k + 1])
        if later < cuts[k]:
            raise ValueError(
                f"schedule {schedule.name!r}: on rank {rank}, {program[later]} (iteration "
                f"{_iteration_of(program[later], schedule.microbatches)}) runs before iteration "
                f"{k} ends; there is no checkpoint boundary after step {k + 1}")
    return cuts


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
            f"checkpoint/resume needs a synchronous schedule, and {schedule.name!r} is "
            f"asynchronous: when iteration k+1 starts, micro-batches of iteration k are still in "
            f"flight with stashed activations and weight versions, so no rank ever reaches a "
            f"point where it can stop and resume exactly. Use gpipe, 1f1b, interleaved-1f1b, "
            f"sliced-1f1b or avgpipe, or run without --checkpoint-dir/--checkpoint-every/--resume")
    if job.advance is not None:
        raise ValueError(
            f"checkpoint/resume with the online advance controller (--advance auto, Job.advance) "
            f"is not supported yet: it runs {schedule.name!r} one iteration at a time, as "
            f"schedules of their own, and checkpoints are positions in the whole run's "
            f"schedule. Fix the advance (--advance K, or --option advance=K), or run without "
            f"--checkpoint-dir/--checkpoint-every/--resume")
    if any(a.op is Op.CHECK for program in schedule.programs for a in program):
        raise ValueError(
            f"checkpoint/resume with a global gradient check in the schedule ({schedule.name!r} "
            f"with post_validation) is not supported yet: an update is final only once the "
            f"check has come back, inside the next iteration. Drop --option post_validation "
            f"(or run without --checkpoint-dir/--checkpoint-every/--resume)")
    ranks = range(schedule.num_ranks) if ranks is None else ranks
    for rank in ranks:
        iteration_boundaries(schedule, rank)
