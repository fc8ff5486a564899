"""Asynchronous schedules checkpoint at drains and resume exactly (single-process executor;
test_async_kill.py kills real ranks). The uninterrupted run drains at the same steps
(``drain=2``, what ``--checkpoint-every 2`` sets), so it is the reference."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pipeweave.runtime import run_local
from pipeweave.runtime.checkpoint.options import CheckpointOptions
from pipeweave.runtime.checkpoint.store import complete_checkpoints

from checkpoint_jobs import assert_same_checkpoint, assert_same_run, gpt_job, with_checkpoints

ASYNC = [("pipedream", 1, "sgd", {}), ("pipedream", 1, "adam", {"vertical_sync": True}),
         ("2bw", 1, "adam", {}), ("pipeoptim", 1, "adam", {}), ("pipeoptim", 1, "sgd", {}),
         ("spectrain", 1, "sgd", {}), ("wpipe", 2, "adam", {})]


def async_job(schedule: str, chunks: int, optimizer: str, options: dict, **fields):  # type: ignore[no-untyped-def]
    return gpt_job(depth=2, schedule=schedule, chunks=chunks, optimizer=optimizer,
                   plan_fields={"schedule_options": options}, **fields)


def drained(job, every: int):  # type: ignore[no-untyped-def]
    options = {**job.plan.schedule_options, "drain": every}
    return dataclasses.replace(job, plan=dataclasses.replace(job.plan, schedule_options=options))


@pytest.mark.parametrize(("schedule", "chunks", "optimizer", "options"), ASYNC,
                         ids=[f"{s[0]}-{s[2]}{'-vs' if s[3] else ''}" for s in ASYNC])
def test_resume_at_a_drain_matches_the_uninterrupted_run(
        schedule: str, chunks: int, optimizer: str, options: dict, tmp_path: Path) -> None:
    job = async_job(schedule, chunks, optimizer, options, steps=6)
    straight = run_local(drained(job, 2))
    written = run_local(with_checkpoints(job, directory=str(tmp_path / "a"), every=2))
    assert_same_run(written, straight, microbatches=4, steps=[1, 2, 3, 4, 5, 6])
    after2, after4, after6 = complete_checkpoints(tmp_path / "a")
    for folder, steps in ((after2, [3, 4, 5, 6]), (after4, [5, 6])):
        # resumed with --resume alone: the drain comes from the checkpoint
        resumed = run_local(dataclasses.replace(
            job, checkpoint=CheckpointOptions(resume=str(folder), directory=str(tmp_path / folder.name))))
        assert_same_run(resumed, straight, microbatches=4, steps=steps)
        (again,) = [c for c in complete_checkpoints(tmp_path / folder.name) if c.name.startswith("step-00000006")]
        assert_same_checkpoint(again, after6)
