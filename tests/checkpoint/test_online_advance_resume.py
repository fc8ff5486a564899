"""AvgPipe's online advance controller (``--advance auto``) checkpoints and resumes exactly.

The controller decides each step's advance from measured times, which differ from run to run;
here it is told the *simulated* time of the advance each step ran with (:class:`SimulatedTime`,
a deterministic ``time_source``), so the uninterrupted run's decisions are known
(``[0, 0, 1, 2, 3, 2, 2, 2]``: warm-up, raise, probe, raise, settle on 2) and a resumed run
must take the same ones. A checkpoint holds the controller's state (``advance`` in the
manifest); a resumed run that lost it would start again at advance 0. Everything else is real:
the schedules interpreted, the losses, parameters, Adam moments and every rank's random stream
(gpt-tiny with dropout).
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import pytest

from pipeweave.avgpipe.simulated import SimulatedTime
from pipeweave.runtime import (BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan, RankResult,
                               RunFailed, launch_local, run_local)
from pipeweave.runtime.advance.options import AdvanceOptions
from pipeweave.runtime.checkpoint.options import AUTO, CheckpointOptions
from pipeweave.runtime.checkpoint.store import StoredCheckpoint, complete_checkpoints
from pipeweave.sim import Costs

from checkpoint_jobs import (KillAfterCheckpoint, assert_same_checkpoint, assert_same_run,
                             dropout_gpt_job, gpt_job, with_checkpoints)

P, M, N, STEPS = 2, 4, 2, 8
CHOSEN = [0, 0, 1, 2, 3, 2, 2, 2]  # tests/avgpipe_runtime/test_online_advance.py derives it


def controller(**fields: Any) -> AdvanceOptions:
    """Algorithm 1 told the simulated time of a slow link (one sample per advance)."""
    source = SimulatedTime(P, M, Costs.uniform(1.0, 2.0, 4.0), pipelines=N)
    return AdvanceOptions(**{"samples": 1, "tolerance": 0.0, "time_source": source, **fields})


def online_job(**fields: Any) -> Job:
    """gpt-tiny with dropout, Adam, P = 2, M = 4, N = 2, 8 steps, the controller on."""
    fields = {"steps": STEPS, "advance": controller(), **fields}
    return dropout_gpt_job(depth=P, schedule="avgpipe", optimizer="adam",
                           plan_fields={"pipelines": N}, **fields)


def decisions(results: list[RankResult]) -> list[tuple[Any, ...]]:
    """What the controller saw (the simulated time, the memory) and did, per measured step."""
    keys = ("step", "advance", "iteration_s", "peak_bytes", "decision", "next_advance", "reason")
    return [tuple(entry[k] for k in keys) for entry in results[0].advance_log]


def assert_same_online_run(got: list[RankResult], want: list[RankResult]) -> None:
    assert_same_run(got, want, microbatches=M, steps=range(1, STEPS + 1))
    assert [r.pipeline_losses for r in got] == [r.pipeline_losses for r in want]
    assert all(r.advance_per_step == want[0].advance_per_step for r in got)
    assert decisions(got) == decisions(want)


@pytest.mark.parametrize("resume_after", [2, 4, 6], ids=["climbing", "probing", "settled"])
def test_resumed_online_advance_takes_the_same_decisions(resume_after: int,
                                                          tmp_path: Path) -> None:
    job = online_job()
    straight = run_local(job)
    assert straight[0].advance_per_step == CHOSEN
    first, second = tmp_path / "first", tmp_path / "second"
    written = run_local(with_checkpoints(job, directory=str(first), every=2))
    assert_same_online_run(written, straight)  # checkpoints (and their windows) change nothing
    folder = next(c for c in complete_checkpoints(first)
                  if StoredCheckpoint(c).step == resume_after)
    saved = StoredCheckpoint(folder).manifest["advance"]
    assert saved["advance_per_step"] == CHOSEN[:resume_after]
    assert saved["controller"]["advance"] == CHOSEN[resume_after]
    assert saved["controller"]["settled"] == (resume_after >= 5)

    resumed = run_local(dataclasses.replace(job, checkpoint=CheckpointOptions(
        resume=str(folder), directory=str(second), every=2)))
    assert_same_online_run(resumed, straight)
    assert_same_checkpoint(complete_checkpoints(second)[-1], complete_checkpoints(first)[-1])
    last = json.loads((complete_checkpoints(second)[-1] / "MANIFEST.json").read_text())
    assert last["advance"]["advance_per_step"] == CHOSEN


def test_resumed_under_another_split_continues_the_controller(tmp_path: Path) -> None:
    # Without dropout (another layout draws fresh random streams): 2 -> 3 stages; the
    # blocks' N models, moments and reference are found wherever they now live, and the
    # controller goes on from its state (here told the same simulated times).
    job = gpt_job(depth=P, schedule="avgpipe", steps=STEPS, optimizer="adam",
                  plan_fields={"pipelines": N}, advance=controller())
    straight = run_local(job)
    run_local(with_checkpoints(dataclasses.replace(job, steps=4), directory=str(tmp_path)))
    three = Plan(num_blocks=6, stages=((0, 1), (1, 4), (4, 6)), schedule="avgpipe",
                 microbatches=M, pipelines=N)
    resumed = run_local(dataclasses.replace(job, plan=three, checkpoint=CheckpointOptions(
        resume=str(tmp_path))))
    assert_same_run(resumed, straight, microbatches=M, steps=range(1, STEPS + 1))
    assert resumed[-1].pipeline_losses == straight[-1].pipeline_losses
    assert all(r.advance_per_step == CHOSEN for r in resumed)
    # the first four steps' log is the checkpoint's; the memory after is the new layout's
    assert decisions(resumed)[:4] == decisions(straight)[:4]
    assert ([e["decision"] for e in resumed[0].advance_log]
            == [e["decision"] for e in straight[0].advance_log])


def test_a_checkpoint_without_the_controller_is_refused(tmp_path: Path) -> None:
    fixed = dataclasses.replace(online_job(steps=2), advance=None)
    run_local(with_checkpoints(fixed, directory=str(tmp_path), every=2))
    before = sorted(p.name for p in tmp_path.iterdir())
    job = online_job(checkpoint=CheckpointOptions(resume=AUTO, directory=str(tmp_path)))
    with pytest.raises(ValueError, match=r"written without the online advance controller.*"
                                         r"--advance K"):
        run_local(job)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # refused before training
    # a fixed advance resumes the controller's checkpoint: the weights map exactly (the
    # advance never changes the numbers), the controller's state is not needed
    run_local(with_checkpoints(online_job(steps=2), directory=str(tmp_path / "auto"), every=2))
    three = dataclasses.replace(fixed, steps=3)
    resumed = run_local(dataclasses.replace(three, checkpoint=CheckpointOptions(
        resume=str(tmp_path / "auto"))))
    assert_same_run(resumed, run_local(three), microbatches=M, steps=[1, 2, 3])


def test_a_controller_with_other_settings_is_refused(tmp_path: Path) -> None:
    run_local(with_checkpoints(online_job(steps=2), directory=str(tmp_path), every=2))
    other = online_job(advance=controller(patience=3),
                       checkpoint=CheckpointOptions(resume=AUTO, directory=str(tmp_path)))
    with pytest.raises(ValueError, match=r"other settings .*'patience': \(1, 3\)"):
        run_local(other)


def _mlp_online() -> Job:
    model = BuiltinModel("mlp", dtype="float64")
    plan = Plan.uniform(4, P, schedule="avgpipe", microbatches=M, pipelines=N)
    return Job(plan=plan, steps=STEPS, model=model,
               data=BuiltinData("digits", batch_size=16, dtype="float64"),
               optimizer=OptimizerFactory("sgd", {"lr": 0.05, "momentum": 0.9}),
               return_parameters=True, timeout_s=60.0, advance=controller())


@pytest.mark.distributed
@pytest.mark.timeout(400)
def test_killed_online_advance_resumes_bit_for_bit(tmp_path: Path) -> None:
    """Two processes, SGD with momentum; a rank SIGKILLed at a step drawn at random."""
    draw = random.Random()
    victim = draw.choice([0, P - 1])
    batch = draw.randrange(3 * N, (STEPS - 1) * N)  # while drawing a batch of step 4..7
    print(f"rank {victim} killed at batch {batch}")  # shown when the test fails
    job = _mlp_online()
    folder, reference = tmp_path / "checkpoints", tmp_path / "reference"
    written = CheckpointOptions(directory=str(folder), every=2, resume=AUTO)
    killing = dataclasses.replace(job, checkpoint=written, data=KillAfterCheckpoint(
        rank=victim, pids=str(tmp_path), at_batch=batch, checkpoints=str(folder)))
    with pytest.raises(RunFailed, match=rf"rank {victim} exited with code -9"):
        launch_local(killing, deadline_s=180)
    done = [StoredCheckpoint(c).step for c in complete_checkpoints(folder)]
    print("complete when killed:", done)
    assert done and max(done) in (2, 4, 6)
    resumed = launch_local(dataclasses.replace(job, checkpoint=written), deadline_s=180)
    straight = run_local(dataclasses.replace(
        job, checkpoint=CheckpointOptions(directory=str(reference), every=2)))
    assert straight[0].advance_per_step == CHOSEN
    assert_same_online_run(resumed, straight)
    assert_same_checkpoint(complete_checkpoints(folder)[-1], complete_checkpoints(reference)[-1])
