"""Resume across real processes (pipeweave's local launcher): exact, also under another plan
and across executors, and with dropout (each rank's random stream is restored)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pipeweave.runtime import Plan, launch_local, run_local
from pipeweave.runtime.checkpoint.options import CheckpointOptions
from pipeweave.runtime.checkpoint.store import complete_checkpoints

from checkpoint_jobs import (assert_same_checkpoint, assert_same_run, dropout_gpt_job, mlp_job,
                             with_checkpoints)

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]


def _resume(job, folder: Path):  # type: ignore[no-untyped-def]
    return dataclasses.replace(job, checkpoint=CheckpointOptions(resume=str(folder)))


def test_processes_resume_exactly_with_dropout(tmp_path: Path) -> None:
    job = dropout_gpt_job(depth=2, steps=5)
    straight = launch_local(with_checkpoints(job, directory=str(tmp_path), every=2),
                            deadline_s=200)
    # Each rank of the single-process executor has its own random stream, as in processes.
    assert_same_run(run_local(job), straight, microbatches=4, steps=[1, 2, 3, 4, 5])
    after2, after4, after5 = complete_checkpoints(tmp_path)
    assert [int(p.name.split("-")[1]) for p in (after2, after4, after5)] == [2, 4, 5]
    resumed = launch_local(_resume(job, after2), deadline_s=200)
    assert_same_run(resumed, straight, microbatches=4, steps=[3, 4, 5])
    # The same checkpoint, resumed by the single-process executor: identical too.
    assert_same_run(run_local(_resume(job, after4)), straight, microbatches=4, steps=[5])


def test_processes_resume_under_another_plan(tmp_path: Path) -> None:
    job = mlp_job(depth=2, steps=5)
    straight = run_local(job)
    launch_local(with_checkpoints(dataclasses.replace(job, steps=3), directory=str(tmp_path)),
                 deadline_s=200)
    four = dataclasses.replace(job, plan=Plan.uniform(4, 4, schedule="gpipe", microbatches=4))
    assert_same_run(launch_local(_resume(four, tmp_path), deadline_s=200), straight,
                    microbatches=4, steps=[4, 5])


def test_processes_resume_avgpipe_exactly(tmp_path: Path) -> None:
    # N=2 parallel pipelines with dropout: each process restores both pipelines' models and
    # Adam moments, the reference model and its random stream.
    job = dropout_gpt_job(depth=2, schedule="avgpipe", steps=5, optimizer="adam",
                          plan_fields={"pipelines": 2})
    first, second = tmp_path / "first", tmp_path / "second"
    straight = launch_local(with_checkpoints(job, directory=str(first), every=2), deadline_s=200)
    after2, after4, after5 = complete_checkpoints(first)
    resumed = launch_local(dataclasses.replace(job, checkpoint=CheckpointOptions(
        resume=str(after2), directory=str(second), every=2)), deadline_s=200)
    assert_same_run(resumed, straight, microbatches=4, steps=[3, 4, 5])
    assert [r.pipeline_losses for r in resumed] == [r.pipeline_losses for r in straight]
    assert_same_checkpoint(complete_checkpoints(second)[-1], after5)
    # The process-written checkpoint, resumed by the single-process executor: identical too.
    assert_same_run(run_local(_resume(job, after4)), straight, microbatches=4, steps=[5])
