"""Tensor parallelism inside a stage (``Plan.tp``, docs/sharding.md): ``pp=2,tp=2`` trains
the parameters a plain torch loop trains on the whole model (1F1B, interleaved 1F1B,
zb-h1), and ``pp=2,dp=2,tp=2`` with ``--shard full`` too; what this slice does not cover is
refused in one line before anything starts."""

from __future__ import annotations

import pytest

from pipeweave.testing import assert_matches_reference, reference_run
from pipeweave.runtime import launch_local

from runtime_jobs import gpt_job


def _job(schedule: str, **plan_fields: object):  # type: ignore[no-untyped-def]
    chunks = 2 if schedule == "interleaved-1f1b" else 1
    return gpt_job(depth=2, schedule=schedule, chunks=chunks, steps=2,
                   plan_fields={"tp": 2, **plan_fields})


@pytest.mark.distributed
@pytest.mark.timeout(600)
@pytest.mark.parametrize("schedule", ["1f1b", "interleaved-1f1b", "zb-h1"])
def test_pp2_tp2_trains_the_whole_models_parameters(schedule: str) -> None:
    job = _job(schedule)
    results = launch_local(job, deadline_s=500)
    assert sorted(r.rank for r in results) == [0, 1]  # one result per pipeline rank
    assert_matches_reference(results, reference_run(job), microbatches=job.plan.microbatches,
                             tolerance=1e-10)


@pytest.mark.distributed
@pytest.mark.timeout(900)
def test_pp2_dp2_tp2_sharded_trains_the_whole_models_parameters() -> None:
    job = _job("1f1b", width=2, shard="full")  # 8 processes: FSDP2 over dp on (dp, tp)
    results = launch_local(job, deadline_s=800)
    assert sorted(r.rank for r in results) == [0, 1, 2, 3]
    assert_matches_reference(results, reference_run(job), microbatches=job.plan.microbatches,
                             tolerance=1e-10)
