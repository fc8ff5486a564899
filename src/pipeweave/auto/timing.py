"""Time a candidate for the search: the timing-only simulator on a schedule built once per shape.

The search simulates several partitions (and recompute/APC variants) of every shape it
examines, and only reads their iteration time and bubble fraction. The schedule is built once
per (schedule, shape, one copy or all): :func:`~pipeweave.schedules.build_schedule` and
:func:`~pipeweave.auto.copies.one_copy_schedule` remember what they built, and the
simulator's action index is remembered per schedule (:func:`action_index`). Each candidate
is timed by :func:`pipeweave.sim.simulate_timing`, the simulator's walk without the critical
path, held activations or weight versions: the same iteration time as
:func:`pipeweave.sim.simulate` (``tests/auto/test_timing.py`` compares them over every
registered schedule).
"""

from __future__ import annotations

from functools import lru_cache

from ..ir import Action, Schedule
from ..ir.walk import Location, index_actions
from ..planner.plan import Plan
from ..schedules import build_schedule
from ..schedules.registry import CACHE_SIZE
from ..sim import Costs, Timing, simulate_timing
from .copies import one_copy_schedule

__all__ = ["time_plan", "plan_schedule", "action_index"]


def plan_schedule(plan: Plan, iterations: int, *, one_copy: bool) -> Schedule:
    """``plan``'s schedule laid out for ``iterations`` (copy 0 alone with ``one_copy``,
    :mod:`pipeweave.auto.copies`); both builders remember the last shapes they built."""
    if one_copy:
        return one_copy_schedule(plan, iterations)
    return build_schedule(plan.schedule, plan.shape(iterations))


class _Held:
    """A schedule, hashed and compared by identity (schedules are immutable, and the
    builders hand out the same object for the same shape)."""

    __slots__ = ("schedule",)

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule

    def __hash__(self) -> int:
        return id(self.schedule)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Held) and other.schedule is self.schedule


def action_index(schedule: Schedule) -> dict[Action, Location]:
    """:func:`~pipeweave.ir.walk.index_actions` of ``schedule``, remembered for the last
    :data:`~pipeweave.schedules.registry.CACHE_SIZE` schedules (built on the first
    simulation of a shape: a shape pruned on memory needs none)."""
    return _index(_Held(schedule))


@lru_cache(maxsize=CACHE_SIZE)
def _index(held: _Held) -> dict[Action, Location]:
    return index_actions(held.schedule)


def time_plan(plan: Plan, costs: Costs, iterations: int, *, one_copy: bool) -> Timing:
    """Iteration time and bubble of ``plan`` under ``costs`` (module docstring)."""
    schedule = plan_schedule(plan, iterations, one_copy=one_copy)
    return simulate_timing(schedule, costs, index=action_index(schedule))
