"""GPipe grouping trains exactly as GPipe does (WPipe appendix A.4: only the order changes).

Per parameter, float64, on 2 ranks holding 2 groups each (4 stages): against non-pipelined
training (``reference_run``: the whole batch through ``torch.nn.Sequential``, one optimizer
step) and against ``gpipe`` on the same 4 stages, one per rank (relative error <= 1e-12: only
the order of the passes differs); in the single-process executor and on real processes
(which must agree bit for bit).
"""

from __future__ import annotations

import dataclasses

import pytest

from pipeweave.runtime import BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan, launch_local, run_local
from pipeweave.testing import (assert_identical_runs, assert_matches_reference, merged_parameters,
                               reference_run, relative_error)

M = 4


def grouped_job(*, recompute: bool = False) -> Job:
    model = BuiltinModel("gpt-tiny", dtype="float64",
                         overrides={"n_layers": 2, "d_model": 16, "n_heads": 2, "d_ff": 32,
                                    "seq_len": 8})
    plan = Plan.uniform(6, 2, chunks=2, schedule="gpipe-grouped", microbatches=M,
                        recompute=(True, False, False, True) if recompute else ())
    return Job(plan=plan, steps=3, model=model,
               data=BuiltinData("stdlib-bytes", batch_size=2 * M, seq_len=8, dtype="float64"),
               optimizer=OptimizerFactory("adam", {"lr": 1e-3}), return_parameters=True)


def gpipe_on_four_ranks(job: Job) -> Job:
    """The same four stages, one per rank, under plain GPipe."""
    plan = Plan(num_blocks=job.plan.num_blocks, stages=job.plan.stages, schedule="gpipe",
                microbatches=M, recompute=job.plan.recompute)
    return dataclasses.replace(job, plan=plan)


def assert_equal_to_gpipe(results, job: Job) -> None:  # type: ignore[no-untyped-def]
    got, want = merged_parameters(results), merged_parameters(run_local(gpipe_on_four_ranks(job)))
    assert got.keys() == want.keys()
    for name in want:
        assert relative_error(got[name], want[name]) <= 1e-12, name


@pytest.mark.parametrize("recompute", [False, True], ids=["graph", "recompute"])
def test_local_grouped_equals_gpipe_and_the_reference(recompute: bool) -> None:
    job = grouped_job(recompute=recompute)
    assert job.plan.world_size == 2 and len(job.plan.stages) == 4
    results = run_local(job)
    assert_equal_to_gpipe(results, job)
    assert_matches_reference(results, reference_run(job), microbatches=M, tolerance=1e-10)


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_two_ranks_grouped_equals_local_gpipe_and_the_reference() -> None:
    job = grouped_job()
    distributed = launch_local(job, deadline_s=200)
    assert_identical_runs(distributed, run_local(job))
    assert_equal_to_gpipe(distributed, job)
    assert_matches_reference(distributed, reference_run(job), microbatches=M, tolerance=1e-10)
