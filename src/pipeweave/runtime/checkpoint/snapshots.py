"""Copies of a rank's weights at chosen iteration boundaries (``Job.eval_every``), for a
held-out loss computed from them (:mod:`..observation.held_out`).

Every ``eval_every`` steps, and after the last step, each rank copies the parameters of the
stages it holds the first replica of (:func:`~..observation.results.owned_parameters`) at the same point a
checkpoint is taken (:func:`~pipeweave.runtime.checkpoint.boundaries.iteration_boundaries`):
after its update of that step, before any action of the next. Put together over the ranks,
they are the whole model exactly as it was after that step. Synchronous schedules only (the
asynchronous ones have no such point).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from torch import Tensor

from ...ir import Op, Schedule
from .boundaries import iteration_boundaries
from ..observation.results import owned_parameters

if TYPE_CHECKING:
    from ..execution.parts import RankParts

__all__ = ["WeightSnapshots", "check_snapshots", "snapshot_steps"]


def check_snapshots(schedule: Schedule, *, pipelines: int, online_advance: bool) -> None:
    """Refuse, in one line naming the fix, a run whose weights have no step boundary to copy."""
    why = ("it is asynchronous (micro-batches of a step are in flight when the next starts)"
           if not schedule.synchronous else
           "it runs parallel pipelines (AvgPipe)" if pipelines != 1 else
           "the online advance controller runs it one step at a time" if online_advance else
           "its global gradient check (post_validation) settles a step inside the next"
           if any(a.op is Op.CHECK for program in schedule.programs for a in program) else None)
    if why is not None:
        raise ValueError(f"--eval-every needs the weights after a step, and schedule "
                         f"{schedule.name!r} has no such point: {why}; use gpipe, 1f1b, "
                         f"interleaved-1f1b or sliced-1f1b, or drop --eval-every")
    for rank in range(schedule.num_ranks):
        iteration_boundaries(schedule, rank)


def snapshot_steps(every: int, steps: int, *, after: int = 0) -> list[int]:
    """The steps (1-based, beyond ``after``) copied: every ``every``-th and the last."""
    return [s for s in range(after + 1, steps + 1) if s % every == 0 or s == steps]


class WeightSnapshots:
    """:attr:`hooks` for the interpreter; :attr:`taken` maps step -> parameters by global
    name."""

    def __init__(self, *, rank: int, parts: RankParts, schedule: Schedule, every: int,
                 steps_done: int) -> None:
        self.rank, self.parts, self.schedule = rank, parts, schedule
        self.taken: dict[int, dict[str, Tensor]] = {}
        cuts = iteration_boundaries(schedule, rank)
        self.hooks: dict[int, Callable[[], None]] = {
            cuts[step - 1] - 1: functools.partial(self._take, step)
            for step in snapshot_steps(every, schedule.iterations, after=steps_done)}

    def _take(self, step: int) -> None:
        self.taken[step] = owned_parameters(self.rank, self.parts, self.schedule)
