"""Asynchronous schedules survive a SIGKILL: a rank is killed at a step drawn at random in the
middle of the run, the run resumes (``--resume auto``) from the newest complete checkpoint,
and its losses, parameters and optimizer state equal the run never interrupted — bit for bit.

``--checkpoint-every 2`` drains every 2 steps (docs/checkpoints.md), and so does the
reference run (the single-process executor, with the same options), so the killed run must
recompute exactly what the reference did after the checkpoint it resumes from.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeweave.cli.cmd_train import add_parser, build_job
from pipeweave.runtime import (BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan, RankResult,
                               RunFailed, launch_local, run_local)
from pipeweave.runtime.checkpoint.options import AUTO, CheckpointOptions
from pipeweave.runtime.checkpoint.store import complete_checkpoints
from pipeweave.runtime.observation.summary import iteration_losses

from checkpoint_jobs import KillAfterCheckpoint, assert_same_checkpoint, assert_same_run

pytestmark = pytest.mark.distributed
SRC = Path(__file__).resolve().parents[2] / "src"

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
    straight = kill_and_resume(async_job(schedule, depth, optimizer), tmp_path)
    assert len(straight) == depth


def kill_and_resume(job: Job, tmp_path: Path) -> list[RankResult]:
    """Kill the first or last rank of ``job`` (at ``--checkpoint-every 2``) while it draws a
    batch of steps 4..7, resume it with ``--resume auto`` and check it against the
    uninterrupted run, which it returns."""
    depth = job.plan.world_size
    draw = random.Random()
    victim = draw.choice([0, depth - 1])  # the ranks that read data
    batch = draw.randrange(3, STEPS - 1)  # killed while drawing batch 3..6 (steps 4..7)
    print(f"rank {victim} killed at batch {batch}")  # shown when the test fails
    folder, reference = tmp_path / "checkpoints", tmp_path / "reference"
    written = CheckpointOptions(directory=str(folder), every=EVERY, resume=AUTO)
    killing = dataclasses.replace(job, checkpoint=written, data=KillAfterCheckpoint(
        rank=victim, pids=str(tmp_path), at_batch=batch, checkpoints=str(folder)))
    with pytest.raises(RunFailed, match=rf"rank {victim} exited with code -9"):
        launch_local(killing, deadline_s=180)
    # The victim waited for a complete checkpoint (each is written in the background), so the
    # run resumes after step 2, 4 or 6 (the drain before the kill, or one before it).
    done = [int(c.name.split("-")[1]) for c in complete_checkpoints(folder)]
    print("complete when killed:", done)
    assert done and max(done) in (2, 4, 6) and max(done) <= batch + 1
    resumed = launch_local(dataclasses.replace(job, checkpoint=written), deadline_s=180)
    straight = run_local(dataclasses.replace(
        job, checkpoint=CheckpointOptions(directory=str(reference), every=EVERY)))
    assert_same_run(resumed, straight, microbatches=M, steps=range(1, STEPS + 1))
    assert_same_checkpoint(complete_checkpoints(folder)[-1], complete_checkpoints(reference)[-1])
    return straight


@pytest.mark.timeout(400)
def test_killed_zb_h2_with_post_validation_resumes_bit_for_bit(tmp_path: Path) -> None:
    """``zb-h2 --option post_validation=true --clip-grad-norm 1``: its checkpoints are at the
    drains ``--checkpoint-every 2`` sets (every 2nd update checked before it); the clip
    undoes and redoes updates on both sides of them."""
    plan = Plan.uniform(2, 2, schedule="zb-h2", microbatches=M,
                        schedule_options={"post_validation": True})
    job = dataclasses.replace(async_job("1f1b", 2, "adam"), plan=plan, clip_grad_norm=1.0)
    straight = kill_and_resume(job, tmp_path)
    assert [u for u in straight[0].undone_updates if u > 6]  # an undo after any resume point


TRAIN = ["--model", "mlp", "--stages", "2", "--steps", "8", "--batch-size", "16",
         "--microbatches", "4", "--dtype", "float64", "--seed", "3", "--no-progress",
         "--timeout", "30", "--schedule", "pipedream", "--checkpoint-every", "2"]


@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("torchrun", path=os.path.dirname(sys.executable)) is None
                    and shutil.which("torchrun") is None, reason="torchrun not available")
def test_torchrun_restart_resumes_pipedream_bit_for_bit(tmp_path: Path) -> None:
    """``torchrun --max-restarts 1``: rank 1 dies once mid-step 6; the restart resumes from
    the newest complete checkpoint and ends where the uninterrupted ``pipedream`` run ends."""
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    marker, checkpoints = tmp_path / "killed-once", tmp_path / "checkpoints"
    env = {**os.environ, "PYTHONPATH": str(SRC),
           "PIPEWEAVE_INJECT_FAULT": f"rank=1,step=6,once={marker}"}
    command = [torchrun, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
               "--monitor-interval", "0.5", "-m", "pipeweave", "train", *TRAIN,
               "--checkpoint-dir", str(checkpoints), "--resume", "auto",
               "--output-dir", str(tmp_path / "out")]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert marker.exists()  # rank 1 did die once, during step 6
    resumed = re.search(r"resuming from \S+ after step (\d) of 8", done.stdout)
    assert resumed is not None and int(resumed.group(1)) in (2, 4), done.stdout
    # The uninterrupted reference: the same command line, one process, drained alike.
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["train", *TRAIN, "--checkpoint-dir", str(tmp_path / "reference")])
    reference = run_local(dataclasses.replace(build_job(args), return_parameters=True))
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["losses"] == iteration_losses(reference, M)
    assert_same_checkpoint(complete_checkpoints(checkpoints)[-1],
                           complete_checkpoints(tmp_path / "reference")[-1])
