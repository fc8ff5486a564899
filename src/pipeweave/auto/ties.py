"""Candidates the runtime would refuse because they split a tied parameter over stages.

A parameter several blocks share (``Profile.ties``: tied word embeddings) becomes a copy per
holding stage when a plan splits those blocks, and the runtime sums the copies' gradients
before each update; a schedule that shows the copies different weight versions, predicts
weights, or checks gradients before the sum cannot keep them one parameter, and
``pipeweave train`` refuses it. The rule is the runtime's own (:func:`pipeweave.ir.ties.
tie_refusal`, on the lowered schedule the runtime runs), asked here before a candidate is
simulated, so ``auto`` never proposes a plan ``train`` refuses: such candidates are counted
as invalid (``SearchResult.refused_ties``).
"""

from __future__ import annotations

from ..ir.ties import tie_refusal
from ..planner.evaluate import simulated_iterations
from ..planner.plan import Plan
from ..profiler import Profile
from ..schedules import lowered_schedule

__all__ = ["TieRefused", "check_ties"]


class TieRefused(ValueError):
    """The plan splits a tied parameter over stages its schedule cannot keep exact."""


def check_ties(plan: Plan, profile: Profile) -> None:
    """Raise :class:`TieRefused`, naming the tie and the reason, where the runtime would."""
    split = [(tie, tie.stages(plan.stages)) for tie in profile.ties]
    split = [(tie, stages) for tie, stages in split if len(stages) > 1]
    if not split:
        return
    schedule = lowered_schedule(plan.schedule, plan.shape(simulated_iterations(plan.schedule)))
    for tie, stages in split:
        reason = tie_refusal(stages, schedule)
        if reason is not None:
            uses = " and ".join(tie.names) or f"blocks {list(tie.blocks)}"
            raise TieRefused(f"{uses} (one tied parameter) on stages "
                             f"{', '.join(map(str, stages))}: {reason}")
