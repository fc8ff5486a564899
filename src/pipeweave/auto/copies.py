"""Simulate one data-parallel copy instead of all ``w`` (the search at scale).

With width ``w`` a plan runs ``w`` identical copies of a ``d``-rank pipeline, micro-batch ``j``
on copy ``j % w`` (:meth:`Layout.data_parallel`), and each stage's replicas all-reduce their
gradients before the update (``schedules/common.update_actions``: ``AR`` then ``U``). When
every copy runs the same program on its own ``M / w`` micro-batches, the copies reach each
all-reduce at the same moment, so copy 0 alone, laid out as a one-copy schedule of ``M / w``
micro-batches with an ``AR`` inserted before every ``U``, has the same timeline, iteration time
and memory per rank as the whole plan: ``d`` ranks to simulate instead of ``d * w``.

Whether a schedule's copies are independent is asked of the schedule, as everything else
(:mod:`pipeweave.schedules.declared`): a small instance is simulated both ways with uneven costs
and compared; a schedule that fails (or ranks that share CPU cores, where the copies compete
for the same cores) is simulated whole.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from ..ir import Action, Op, Schedule
from ..planner.plan import Plan
from ..schedules import Shape, build_schedule, get_info
from ..schedules.registry import CACHE_SIZE, Generator
from ..sim import Costs, simulate

__all__ = ["one_copy_plan", "one_copy_schedule", "copies_independent"]


def one_copy_plan(plan: Plan) -> Plan:
    """Copy 0 of ``plan`` as a plan of its own (width 1, ``M / w`` micro-batches, nothing to
    shard over: the caller keeps ``plan``'s sharding where it matters, e.g. memory)."""
    return replace(plan, width=1, shard="none", microbatches=plan.microbatches // plan.width)


def one_copy_schedule(plan: Plan, iterations: int) -> Schedule:
    """Copy 0's programs with the all-reduce of every replicated stage before its update;
    remembered for the last :data:`~pipeweave.schedules.registry.CACHE_SIZE` shapes, as
    :func:`~pipeweave.schedules.build_schedule` is."""
    info = get_info(plan.schedule)  # its generator in the key: a name registered anew is new
    return _one_copy(plan.schedule, info.generate, one_copy_plan(plan).shape(iterations))


@lru_cache(maxsize=CACHE_SIZE)
def _one_copy(name: str, generate: Generator, shape: Shape) -> Schedule:
    single = build_schedule(name, shape)
    return single.with_programs([_reduced_before_steps(p) for p in single.programs])


def _reduced_before_steps(program: tuple[Action, ...]) -> tuple[Action, ...]:
    """``program`` with an ``AR`` before every ``U``: the runs between updates copied as
    slices (a 256-stage shape has millions of actions and a few updates a rank)."""
    step = Op.STEP
    updates = [i for i, action in enumerate(program) if action.op is step]
    out: list[Action] = []
    done = 0
    for i in updates:
        update = program[i]
        out.extend(program[done:i])
        out.append(Action(Op.ALL_REDUCE, update.stage, version=update.version,
                          pipeline=update.pipeline))
        done = i
    out.extend(program[done:])
    return tuple(out)


@lru_cache(maxsize=None)
def copies_independent(schedule: str, chunks: int, pipelines: int) -> bool:
    """One copy simulates like the whole plan, on a small instance (module docstring)."""
    info = get_info(schedule)
    depth, width = 2, 2
    probe = Shape(stages=depth, microbatches=1, chunks=chunks, width=width, pipelines=pipelines)
    try:
        microbatches = width * max(info.min_microbatches(probe), 2 * depth)
        plan = Plan.uniform(depth * chunks * 2, depth, chunks=chunks, schedule=schedule,
                            microbatches=microbatches, width=width, pipelines=pipelines)
        stages = depth * chunks
        costs = Costs(forward=[1.0 + 0.3 * s for s in range(stages)],
                      backward=[2.0 + 0.5 * (s % 3) for s in range(stages)],
                      comm=0.25, update=0.5, all_reduce=[0.7 + 0.1 * s for s in range(stages)])
        iterations = 1 if info.synchronous else 4
        whole = simulate(build_schedule(schedule, plan.shape(iterations)), costs)
        one = simulate(one_copy_schedule(plan, iterations), costs)
    except ValueError:
        return False
    return (abs(whole.iteration_time - one.iteration_time) <= 1e-9 * whole.iteration_time
            and whole.peak_activations[:depth] == one.peak_activations)
