"""avgpipe resumes exactly: every parallel pipeline's model and optimizer state, the reference
model, the losses and the data position (N batches per step) continue as if never stopped
(single-process executor; test_distributed_resume.py does it across processes)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pipeweave.runtime import Plan, run_local
from pipeweave.runtime.checkpoint.options import CheckpointOptions
from pipeweave.runtime.checkpoint.store import StoredCheckpoint, complete_checkpoints

from checkpoint_jobs import (assert_same_checkpoint, assert_same_run, dropout_gpt_job, gpt_job,
                             mlp_job, with_checkpoints)


def _avgpipe(pipelines: int, advance: int = 0, **fields):  # type: ignore[no-untyped-def]
    """gpt-tiny with dropout (every rank's random stream matters), Adam, 2 stages, M=4."""
    return dropout_gpt_job(depth=2, schedule="avgpipe", steps=6, optimizer="adam",
                           plan_fields={"pipelines": pipelines,
                                        "schedule_options": {"advance": advance}}, **fields)


@pytest.mark.parametrize(("pipelines", "advance"), [(2, 0), (3, 1)], ids=["N=2", "N=3,advance=1"])
def test_resume_after_step_2_of_6_is_exact(pipelines: int, advance: int, tmp_path: Path) -> None:
    job = _avgpipe(pipelines, advance)
    straight = run_local(job)
    first, second = tmp_path / "first", tmp_path / "second"
    written = run_local(with_checkpoints(job, directory=str(first), every=2))
    # Taking checkpoints changes nothing (reference model, every pipeline's losses).
    assert_same_run(written, straight, microbatches=4, steps=[1, 2, 3, 4, 5, 6])
    assert [r.pipeline_losses for r in written] == [r.pipeline_losses for r in straight]
    after2, _, after6 = complete_checkpoints(first)
    shard = StoredCheckpoint(after2).load("rank1.pt")
    assert sorted(shard["pipelines"]) == [str(p) for p in range(1, pipelines)]
    assert shard["reference"].keys() == shard["parameters"].keys()
    assert StoredCheckpoint(after2).manifest["data"]["batches_done"] == 2 * pipelines

    resumed = run_local(dataclasses.replace(job, checkpoint=CheckpointOptions(
        resume=str(after2), directory=str(second), every=2)))
    assert_same_run(resumed, straight, microbatches=4, steps=[3, 4, 5, 6])
    assert [r.pipeline_losses for r in resumed] == [r.pipeline_losses for r in straight]
    # The resumed run's own checkpoint after step 6 equals the uninterrupted one tensor for
    # tensor: every pipeline's parameters and Adam moments, the reference, losses, RNG.
    assert_same_checkpoint(complete_checkpoints(second)[-1], after6)


def test_resume_under_another_split(tmp_path: Path) -> None:
    # Blocks, their N models, moments and reference are found wherever they now live.
    job = gpt_job(depth=2, schedule="avgpipe", steps=5, optimizer="adam",
                  plan_fields={"pipelines": 2})
    straight = run_local(job)
    run_local(with_checkpoints(dataclasses.replace(job, steps=2), directory=str(tmp_path)))
    three = dataclasses.replace(job, plan=Plan(num_blocks=6, stages=((0, 1), (1, 4), (4, 6)),
                                               schedule="avgpipe", microbatches=4, pipelines=2))
    resumed = run_local(dataclasses.replace(three, checkpoint=CheckpointOptions(
        resume=str(tmp_path))))
    assert_same_run(resumed, straight, microbatches=4, steps=[3, 4, 5])
    assert [r.pipeline_losses for r in resumed][-1] == straight[-1].pipeline_losses


@pytest.mark.parametrize(("written", "resumed"), [(2, 3), (2, 1)])
def test_another_number_of_pipelines_is_refused(written: int, resumed: int,
                                                 tmp_path: Path) -> None:
    job = mlp_job(depth=2, schedule="avgpipe", steps=3, plan_fields={"pipelines": written})
    run_local(with_checkpoints(dataclasses.replace(job, steps=1), directory=str(tmp_path)))
    before = sorted(p.name for p in tmp_path.iterdir())
    other = dataclasses.replace(job, plan=dataclasses.replace(job.plan, pipelines=resumed),
                                checkpoint=CheckpointOptions(resume=str(tmp_path),
                                                             directory=str(tmp_path)))
    with pytest.raises(ValueError, match=rf"written with {written} parallel pipelines .* this run "
                                         rf"has N={resumed}.*Resume with --pipelines {written}"):
        run_local(other)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # refused before training


def test_one_pipeline_resumes_a_1f1b_checkpoint(tmp_path: Path) -> None:
    # With N = 1 the reference is the model itself, so a checkpoint without one will do.
    job = mlp_job(depth=2, steps=4)
    straight = run_local(job)
    run_local(with_checkpoints(dataclasses.replace(job, steps=2), directory=str(tmp_path)))
    single = dataclasses.replace(job, plan=dataclasses.replace(job.plan, schedule="avgpipe"),
                                 checkpoint=CheckpointOptions(resume=str(tmp_path)))
    assert_same_run(run_local(single), straight, microbatches=4, steps=[3, 4])

