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

The synchronous schedules :mod:`pipeweave.schedules.flush_arrays` covers (GPipe, 1F1B,
interleaved 1F1B, GPipe grouping, ZB-H1/H2, the V schedules, DualPipeV, interleaved ZB,
sliced 1F1B, AvgPipe with one pipeline) on one pipeline copy skip the actions altogether:
their programs are laid out as numpy columns and timed by the compiled walk built from them
(:mod:`pipeweave.sim.compiled_arrays`), the same numbers to the last bit, some 14x cheaper at 256 stages x 2,048 micro-batches per copy (docs/auto.md,
"Search at scale"); :func:`floor_programs` hands the same columns to the memory floor.
"""

from __future__ import annotations

from functools import cached_property, lru_cache

from ..ir import Action, Schedule
from ..ir.walk import Location, index_actions
from ..planner.plan import Plan
from ..schedules import Shape, build_schedule, get_info
from ..schedules.flush_arrays import ArrayPrograms, columns_shape, flush_arrays
from ..schedules.registry import CACHE_SIZE, Generator
from ..sim import Costs, Timing, simulate_timing
from ..sim.compiled import Compiled
from ..sim.compiled_arrays import compile_arrays, time_arrays
from .copies import one_copy_plan, one_copy_schedule

__all__ = ["time_plan", "plan_schedule", "action_index", "floor_programs"]


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
    fast = _columns(plan, iterations, one_copy)
    timing = None if fast is None else time_arrays(fast.programs, fast.compiled, costs)
    if timing is not None:
        return timing
    schedule = plan_schedule(plan, iterations, one_copy=one_copy)
    return simulate_timing(schedule, costs, index=action_index(schedule))


def floor_programs(plan: Plan, *, one_copy: bool) -> Schedule | ArrayPrograms:
    """What :func:`~pipeweave.auto.memory.memory_floor` walks for ``plan``'s one iteration:
    its programs as columns where :mod:`~pipeweave.schedules.flush_arrays` lays them out,
    else the schedule (:func:`plan_schedule`)."""
    fast = _columns(plan, 1, one_copy)
    return plan_schedule(plan, 1, one_copy=one_copy) if fast is None else fast.programs


class _Columns:
    """A shape's programs as columns and, once timed, their compiled graph."""

    def __init__(self, programs: ArrayPrograms) -> None:
        self.programs = programs

    @cached_property
    def compiled(self) -> Compiled:
        return compile_arrays(self.programs)


def _columns(plan: Plan, iterations: int, one_copy: bool) -> _Columns | None:
    shape = (one_copy_plan(plan) if one_copy else plan).shape(iterations)
    return _laid_out(plan.schedule, get_info(plan.schedule).generate,
                     columns_shape(plan.schedule, shape), one_copy)


@lru_cache(maxsize=4)  # the compiled graph of a 512-stage shape holds some 100 MB
def _laid_out(name: str, generate: Generator, shape: Shape, one_copy: bool) -> _Columns | None:
    """``name``'s programs on ``shape`` as columns, kept per shape (``generate`` only keys the
    cache: a name registered again with another generator is laid out afresh)."""
    programs = flush_arrays(name, shape, reduce_before_step=one_copy)
    return None if programs is None else _Columns(programs)
