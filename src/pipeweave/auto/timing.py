"""Time a candidate for the search: the timing-only simulator on a schedule built once per shape.

The search simulates several partitions (and recompute/APC variants) of every shape it
examines, and only reads their iteration time and bubble fraction. So the schedule (and the
simulator's action index) is built once per (schedule, shape, one copy or all) and kept for
the last :data:`CACHE_SIZE` shapes, and each candidate is timed by
:func:`pipeweave.sim.simulate_timing`, the simulator's walk without the critical path, held
activations or weight versions: the same iteration time as :func:`pipeweave.sim.simulate`
(``tests/auto/test_timing.py`` compares them over every registered schedule).
"""

from __future__ import annotations

import json
from collections import OrderedDict

from ..ir import Action, Schedule
from ..ir.walk import Location, index_actions
from ..planner.plan import Plan
from ..schedules import build_schedule
from ..sim import Costs, Timing, simulate_timing
from .copies import one_copy_schedule

__all__ = ["time_plan", "plan_schedule", "CACHE_SIZE"]

CACHE_SIZE = 8
"""Shapes whose schedule is kept (least recently used dropped)."""

_CACHE: OrderedDict[tuple[object, ...], Schedule] = OrderedDict()
_INDEX: dict[int, tuple[Schedule, dict[Action, Location]]] = {}


def plan_schedule(plan: Plan, iterations: int, *, one_copy: bool) -> Schedule:
    """``plan``'s schedule laid out for ``iterations`` (copy 0 alone with ``one_copy``,
    :mod:`pipeweave.auto.copies`), cached per shape."""
    shape = plan.shape(iterations)
    key = (plan.schedule, one_copy, shape.stages, shape.microbatches, shape.iterations,
           shape.chunks, shape.width, shape.replicas, shape.pipelines,
           json.dumps(dict(shape.options), sort_keys=True, default=repr))
    found = _CACHE.get(key)
    if found is not None:
        _CACHE.move_to_end(key)
        return found
    schedule = one_copy_schedule(plan, iterations) if one_copy else \
        build_schedule(plan.schedule, shape)
    _CACHE[key] = schedule
    while len(_CACHE) > CACHE_SIZE:
        dropped = _CACHE.popitem(last=False)[1]
        _INDEX.pop(id(dropped), None)
    return schedule


def time_plan(plan: Plan, costs: Costs, iterations: int, *, one_copy: bool) -> Timing:
    """Iteration time and bubble of ``plan`` under ``costs`` (module docstring); the action
    index is built on the first simulation of a shape (a shape pruned on memory needs none)."""
    schedule = plan_schedule(plan, iterations, one_copy=one_copy)
    entry = _INDEX.get(id(schedule))
    if entry is None or entry[0] is not schedule:
        entry = _INDEX[id(schedule)] = (schedule, index_actions(schedule))
    return simulate_timing(schedule, costs, index=entry[1])
