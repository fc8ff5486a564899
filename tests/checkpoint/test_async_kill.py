"""Asynchronous schedules survive a SIGKILL: a rank is killed at a step drawn at random in the
middle of the run, the run resumes (``--resume auto``) from the newest complete checkpoint,
and its losses, parameters and optimizer state equal the run never interrupted — bit for bit.

``--checkpoint-every 2`` drains every 2 steps (docs/checkpoints.md), and so does the
reference run (the single-process executor, with the same options), so the killed run must
recompute exactly what the reference did after the checkpoint it resumes from.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from pipeweave.runtime import (BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan, RunFailed,
                               launch_local, run_local)
from pipeweave.runtime.checkpoint.options import AUTO, CheckpointOptions
from pipeweave.runtime.checkpoint.store import complete_checkpoints

from checkpoint_jobs import KillingData, assert_same_checkpoint, assert_same_run

pytestmark = pytest.mark.distributed

STEPS, EVERY, M = 8, 2, 4
OPTIMIZERS = {"adam": ("adam", {"lr": 1e-2}), "sgdm": ("sgd", {"lr": 0.05, "momentum": 0.9})}
CASES = [  # schedule, P, optimizer
    ("pipedream", 2, "adam"), ("2bw", 2, "sgdm"), ("wpipe", 2, "sgdm"),
    ("pipeoptim", 2, "adam"), ("spectrain", 2, "sgdm"),
    ("pipedream", 4, "sgdm"), ("wpipe", 4, "adam"),
]


def async_job(schedule: str, depth: int, optimizer: str) -> Job:
    chunks = 2 if schedule == "wpipe" else 1
    blocks = depth * chunks
    name, kwargs = OPTIMIZERS[optimizer]
    return Job(plan=Plan.uniform(blocks, depth, chunks=chunks, schedule=schedule, microbatches=M),
               steps=STEPS, model=BuiltinModel("mlp", dtype="float64",
                                               overrides={"n_hidden_layers": blocks - 1}),
               data=BuiltinData("digits", batch_size=16, dtype="float64"),
               optimizer=OptimizerFactory(name, kwargs), return_parameters=True, timeout_s=60.0)


@pytest.mark.timeout(400)
@pytest.mark.parametrize(("schedule", "depth", "optimizer"), CASES,
                         ids=[f"{s}-P{p}-{o}" for s, p, o in CASES])
def test_killed_at_a_random_step_resumes_bit_for_bit(schedule: str, depth: int, optimizer: str,
                                                      tmp_path: Path) -> None:
    draw = random.Random()
    victim = draw.choice([0, depth - 1])  # the ranks that read data
    batch = draw.randrange(3, STEPS - 1)  # killed while drawing batch 3..6 (steps 4..7)
    print(f"rank {victim} killed at batch {batch}")  # shown when the test fails
    job = async_job(schedule, depth, optimizer)
    folder, reference = tmp_path / "checkpoints", tmp_path / "reference"
    written = CheckpointOptions(directory=str(folder), every=EVERY, resume=AUTO)
    killing = dataclasses.replace(job, checkpoint=written, data=KillingData(
        rank=victim, pids=str(tmp_path), at_batch=batch))
    with pytest.raises(RunFailed, match=rf"rank {victim} exited with code -9"):
        launch_local(killing, deadline_s=180)
    # The newest complete checkpoint: after step 2, 4 or 6 (or none yet: each write runs in
    # the background and a step of this model takes milliseconds; then it starts afresh).
    print("complete when killed:", [c.name for c in complete_checkpoints(folder)])
    resumed = launch_local(dataclasses.replace(job, checkpoint=written), deadline_s=180)
    straight = run_local(dataclasses.replace(
        job, checkpoint=CheckpointOptions(directory=str(reference), every=EVERY)))
    assert_same_run(resumed, straight, microbatches=M, steps=range(1, STEPS + 1))
    assert_same_checkpoint(complete_checkpoints(folder)[-1], complete_checkpoints(reference)[-1])
