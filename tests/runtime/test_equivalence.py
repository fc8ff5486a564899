"""Synchronous schedules equal non-pipelined training, per parameter (DESIGN.md facts)."""

from __future__ import annotations

import dataclasses

import pytest

from pipeweave.runtime import launch_local, run_local
from pipeweave.schedules import available_schedules
from pipeweave.testing import assert_identical_runs, assert_matches_reference, reference_run

from runtime_jobs import gpt_job, mlp_job

REGISTERED = {info.name for info in available_schedules()}
SYNC = [s for s in ("gpipe", "1f1b", "interleaved-1f1b", "sliced-1f1b", "gpipe-grouped")
        if s in REGISTERED]
CHUNKED = {"interleaved-1f1b": 2, "gpipe-grouped": 2}


def _plan_fields(schedule: str) -> dict:
    return {"schedule_options": {"sliced": 2}} if schedule == "sliced-1f1b" else {}


@pytest.mark.parametrize("schedule", SYNC)
@pytest.mark.parametrize("depth", [2, 3])
@pytest.mark.parametrize("recompute", [False, True])
def test_local_matches_reference_float64(schedule: str, depth: int, recompute: bool) -> None:
    chunks = CHUNKED.get(schedule, 1)
    if chunks * depth > 6:
        pytest.skip("model has 6 blocks")
    microbatches = 2 * depth if schedule == "interleaved-1f1b" else 4
    fields = _plan_fields(schedule)
    if recompute:
        fields["recompute"] = tuple([True, False] * depth)[: depth * chunks]
    job = gpt_job(depth=depth, schedule=schedule, chunks=chunks, microbatches=microbatches,
                  plan_fields=fields)
    assert_matches_reference(run_local(job), reference_run(job), microbatches=microbatches,
                             tolerance=1e-10)


@pytest.mark.parametrize("schedule", SYNC)
def test_data_parallel_width_matches_reference(schedule: str) -> None:
    chunks = CHUNKED.get(schedule, 1)
    job = gpt_job(depth=2, schedule=schedule, chunks=chunks, microbatches=4,
                  plan_fields={"width": 2, **_plan_fields(schedule)})
    assert job.plan.world_size == 4
    assert_matches_reference(run_local(job), reference_run(job), microbatches=4, tolerance=1e-10)


def test_float32_within_1e5() -> None:
    job = gpt_job(depth=2, dtype="float32", optimizer="sgd", steps=4)
    assert_matches_reference(run_local(job), reference_run(job), microbatches=4, tolerance=1e-5)


@pytest.mark.distributed
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "job",
    [
        pytest.param(gpt_job(depth=2, schedule="1f1b"), id="gpt-1f1b-2ranks"),
        pytest.param(gpt_job(depth=2, schedule="gpipe", plan_fields={"recompute": (True, True)}),
                     id="gpt-gpipe-recompute-2ranks"),
        pytest.param(mlp_job(depth=4, schedule="1f1b"), id="mlp-1f1b-4ranks"),
        pytest.param(gpt_job(depth=2, schedule="1f1b", plan_fields={"width": 2}),
                     id="gpt-1f1b-width2-4ranks"),
    ],
)
def test_distributed_equals_local_and_reference(job) -> None:
    distributed = launch_local(job, deadline_s=200)
    assert_identical_runs(distributed, run_local(job))
    assert_matches_reference(distributed, reference_run(job), microbatches=job.plan.microbatches,
                             tolerance=1e-10)


@pytest.mark.distributed
@pytest.mark.timeout(240)
@pytest.mark.parametrize("schedule", [s for s in SYNC
                                      if s in ("interleaved-1f1b", "sliced-1f1b", "gpipe-grouped")])
def test_distributed_chunked_and_sliced(schedule: str) -> None:
    chunks = CHUNKED.get(schedule, 1)
    job = gpt_job(depth=2, schedule=schedule, chunks=chunks, plan_fields=_plan_fields(schedule))
    distributed = launch_local(job, deadline_s=200)
    assert_matches_reference(distributed, reference_run(job), microbatches=4, tolerance=1e-10)
    assert_identical_runs(distributed, run_local(dataclasses.replace(job)))
