"""Every schedule that splits the backward (I, then W) trains exactly as 1F1B does.

Per parameter, float64: the split schedules against 1F1B on the same blocks and batches
(relative error <= 1e-12: only the order in which micro-batch gradients are summed differs)
and against non-pipelined training; in the single-process executor and on real processes
(which must agree bit for bit). The schedules are found in the registry, so a newly
registered split schedule is checked without a change here.
"""

from __future__ import annotations

import dataclasses

import pytest

from pipeweave.ir import Op
from pipeweave.runtime import BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan, launch_local, run_local
from pipeweave.schedules import available_schedules, build_schedule
from pipeweave.schedules.registry import Shape
from pipeweave.testing import (assert_identical_runs, assert_matches_reference, merged_parameters,
                               reference_run, relative_error)


def _splits(name: str, chunks: int) -> bool:
    info = next(i for i in available_schedules() if i.name == name)
    shape = Shape(stages=2, microbatches=4, chunks=chunks)
    if shape.microbatches < info.min_microbatches(shape):
        shape = Shape(stages=2, microbatches=info.min_microbatches(shape), chunks=chunks)
    schedule = build_schedule(name, shape)
    return any(a.op is Op.BACKWARD_INPUT for program in schedule.programs for a in program)


SPLIT = sorted(info.name for info in available_schedules()
               if info.synchronous and _splits(info.name, info.default_chunks))


def split_job(schedule: str, depth: int, *, recompute: bool = False, steps: int = 2) -> Job:
    info = next(i for i in available_schedules() if i.name == schedule)
    chunks = info.default_chunks
    microbatches = max(2 * depth, info.min_microbatches(Shape(stages=depth, microbatches=1,
                                                              chunks=chunks)))
    stages = depth * chunks
    layers = max(2, (stages - 1) // 2)  # gpt-tiny has 2 * layers + 2 blocks
    model = BuiltinModel("gpt-tiny", dtype="float64",
                         overrides={"n_layers": layers, "d_model": 16, "n_heads": 2, "d_ff": 32,
                                    "seq_len": 8})
    plan = Plan.uniform(2 * layers + 2, depth, chunks=chunks, schedule=schedule,
                        microbatches=microbatches,
                        recompute=tuple([True, False] * stages)[:stages] if recompute else ())
    return Job(plan=plan, steps=steps, model=model,
               data=BuiltinData("stdlib-bytes", batch_size=2 * microbatches, seq_len=8,
                                dtype="float64"),
               optimizer=OptimizerFactory("adam", {"lr": 1e-3}), return_parameters=True)


def one_f_one_b(job: Job) -> Job:
    """The same blocks, batches and micro-batches under 1F1B with one stage per rank."""
    plan = Plan.uniform(job.plan.num_blocks, job.plan.depth, schedule="1f1b",
                        microbatches=job.plan.microbatches)
    return dataclasses.replace(job, plan=plan)


def assert_equal_to_1f1b(results, job: Job) -> None:  # type: ignore[no-untyped-def]
    got, want = merged_parameters(results), merged_parameters(run_local(one_f_one_b(job)))
    assert got.keys() == want.keys()
    for name in want:
        assert relative_error(got[name], want[name]) <= 1e-12, name


def test_some_schedule_splits_the_backward() -> None:
    assert SPLIT, "no registered schedule has I/W actions"


@pytest.mark.parametrize("schedule", SPLIT)
@pytest.mark.parametrize("depth", [2, 4])
@pytest.mark.parametrize("recompute", [False, True], ids=["graph", "recompute"])
def test_local_split_schedule_equals_1f1b_and_the_reference(schedule: str, depth: int,
                                                            recompute: bool) -> None:
    job = split_job(schedule, depth, recompute=recompute)
    results = run_local(job)
    assert_equal_to_1f1b(results, job)
    assert_matches_reference(results, reference_run(job), microbatches=job.plan.microbatches,
                             tolerance=1e-10)


@pytest.mark.distributed
@pytest.mark.timeout(300)
@pytest.mark.parametrize("schedule", SPLIT)
@pytest.mark.parametrize("depth", [2, 4])
def test_distributed_split_schedule_equals_local_and_1f1b(schedule: str, depth: int) -> None:
    job = split_job(schedule, depth)
    distributed = launch_local(job, deadline_s=280)
    assert_identical_runs(distributed, run_local(job))
    assert_equal_to_1f1b(distributed, job)


@pytest.mark.parametrize("schedule", ["1f1b", *SPLIT])
@pytest.mark.parametrize("depth", [2, 4])
def test_activations_held_until_W_equal_the_simulator(schedule: str, depth: int) -> None:
    """The runtime keeps a micro-batch's activations from its F until its W (or B), and the
    most it holds at once on each rank is what the simulator counts for the lowered schedule
    (where an I next to its W ran as one B)."""
    from pipeweave.runtime.execution.parts import make_schedule
    from pipeweave.sim import simulate

    job = split_job(schedule, depth) if schedule != "1f1b" else one_f_one_b(split_job("zb-h1", depth))
    measured = [r.peak_stashed_microbatches for r in run_local(job)]
    assert measured == simulate(make_schedule(job.plan, job.steps)).peak_activations
