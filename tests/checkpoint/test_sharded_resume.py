"""Checkpoints of sharded (``--shard full``, FSDP2 over ``dp``) and tensor-parallel (``tp``)
runs: they hold whole tensors, as an unsharded run's do, so a run resumed under the same mesh
equals the uninterrupted one bit for bit, and one resumed under another mesh equals it to
rounding (docs/checkpoints.md, "What resumes under which change"), also with both at once
(``pp=2,dp=2,tp=2 --shard full``).

"To rounding" is ``rtol=1e-10`` in float64: another mesh sums the same gradients in another
order (an all-reduce or a local sum instead of a reduce-scatter; a tensor-parallel row split's
partial sums), a relative difference of about 1e-16 per sum, which two Adam steps on gpt-tiny
keep far below 1e-10 (the tolerance the sharding and tensor-parallel equivalence tests use).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from pipeweave.runtime import Job, RankResult, launch_local, run_local
from pipeweave.runtime.checkpoint.options import CheckpointOptions
from pipeweave.runtime.checkpoint.store import StoredCheckpoint, complete_checkpoints
from pipeweave.testing import merged_parameters

from checkpoint_jobs import (assert_same_checkpoint_part, assert_same_run, gpt_job,
                             iteration_losses, with_checkpoints)

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(900)]

STEPS = 4
M = 4


def _job(**plan_fields: Any) -> Job:
    """gpt-tiny, float64, Adam (moments and a step counter per parameter), 4 steps."""
    return gpt_job(depth=2, steps=STEPS, optimizer="adam", plan_fields=plan_fields)


def _mesh(job: Job, **plan_fields: Any) -> Job:
    return dataclasses.replace(job, plan=dataclasses.replace(job.plan, **plan_fields))


def _resume(job: Job, folder: Path, into: Path | None = None) -> Job:
    return dataclasses.replace(job, checkpoint=CheckpointOptions(
        resume=str(folder), directory=None if into is None else str(into), every=2))


def _assert_close_run(got: Sequence[RankResult], want: Sequence[RankResult]) -> None:
    """Parameters and the losses after the resume within rounding (module docstring)."""
    a, b = merged_parameters(got), merged_parameters(want)
    assert a.keys() == b.keys() and a
    for name in b:
        torch.testing.assert_close(a[name], b[name], rtol=1e-10, atol=1e-12, msg=name)
    losses_got, losses_want = iteration_losses(got, M), iteration_losses(want, M)
    assert losses_got[:2] == losses_want[:2]  # restored from the checkpoint
    torch.testing.assert_close(torch.tensor(losses_got[2:]), torch.tensor(losses_want[2:]),
                               rtol=1e-10, atol=0)


def _assert_whole(folder: Path, job: Job) -> None:
    """The checkpoint holds every parameter and its Adam state whole, as an unsharded run."""
    stored = StoredCheckpoint(folder)
    spec = job.model()
    shapes = {f"{i}.{n}": p.shape for i, block in enumerate(spec.blocks)
              for n, p in block.named_parameters()}
    assert stored.manifest["parameters"].keys() == shapes.keys()
    for shard in stored.manifest["shards"]:
        data = stored.load(shard["file"])
        for name, tensor in data["parameters"].items():
            assert type(tensor) is torch.Tensor and tensor.shape == shapes[name], name
            state = data["optimizer"][name]
            assert state["exp_avg"].shape == state["exp_avg_sq"].shape == shapes[name], name
            assert type(state["exp_avg"]) is torch.Tensor and int(state["step"]) == 2, name


def _assert_same_state(got: Path, want: Path) -> None:
    """Every shard's parameters and optimizer state bit for bit (the losses of a width-2 run
    are restored onto the first copy's last rank, so they are split over shards otherwise)."""
    for name in sorted(p.name for p in want.glob("rank*.pt")):
        a, b = StoredCheckpoint(got).load(name), StoredCheckpoint(want).load(name)
        for key in ("parameters", "optimizer"):
            assert_same_checkpoint_part(a[key], b[key], f"{name}[{key}]")


def _resumed_exactly(job: Job, tmp_path: Path) -> tuple[list[RankResult], Path]:
    """Run ``job`` straight with a checkpoint every 2 steps (each holding whole tensors), then
    resume it after step 2 under the same mesh: bit for bit, and the checkpoint it writes after
    step 4 too. The straight run's results and its step-2 checkpoint, for other meshes."""
    first, second = tmp_path / "first", tmp_path / "second"
    straight = launch_local(with_checkpoints(job, directory=str(first), every=2), deadline_s=800)
    after2, after4 = complete_checkpoints(first)
    _assert_whole(after2, job)
    resumed = launch_local(_resume(job, after2, into=second), deadline_s=800)
    assert_same_run(resumed, straight, microbatches=M, steps=[3, 4])
    _assert_same_state(complete_checkpoints(second)[-1], after4)
    return straight, after2


def test_sharded_run_resumes_exactly_and_under_other_meshes(tmp_path: Path) -> None:
    job = _job(width=2, shard="full")
    straight, after2 = _resumed_exactly(job, tmp_path)
    # Another mesh: replicated width 2, and one copy (pp=2,dp=1), to rounding.
    _assert_close_run(run_local(_resume(_mesh(job, shard="none"), after2)), straight)
    _assert_close_run(run_local(_resume(_mesh(job, width=1, shard="none"), after2)), straight)


def test_tensor_parallel_run_resumes_exactly_and_under_other_meshes(tmp_path: Path) -> None:
    job = _job(tp=2)
    straight, after2 = _resumed_exactly(job, tmp_path)
    assert sorted(p.name for p in after2.glob("rank*.pt")) == ["rank0.pt", "rank1.pt"]
    # The whole stages (pp=2, tp=1), to rounding; and a sharded run's checkpoint under tp=2.
    _assert_close_run(run_local(_resume(_mesh(job, tp=1), after2)), straight)


def test_sharded_checkpoint_resumes_under_tensor_parallelism(tmp_path: Path) -> None:
    job = _job(width=2, shard="full")
    launch_local(with_checkpoints(dataclasses.replace(job, steps=2), directory=str(tmp_path)),
                 deadline_s=800)
    straight = run_local(_mesh(job, shard="none"))  # equal to the sharded run (test_sharding)
    tp = _mesh(job, width=1, shard="none", tp=2)
    _assert_close_run(launch_local(_resume(tp, tmp_path), deadline_s=800), straight)


def test_sharded_tensor_parallel_run_resumes_exactly_and_unsharded(tmp_path: Path) -> None:
    # pp=2,dp=2,tp=2 --shard full (8 processes): FSDP2's 2-D layout of the head-split qkv is
    # gathered and cut in two steps (runtime/execution/two_step.py); a permuted Adam moment
    # would break the resumed run's agreement with the unsharded one.
    job = _job(width=2, shard="full", tp=2)
    straight, after2 = _resumed_exactly(job, tmp_path)
    _assert_close_run(run_local(_resume(_mesh(job, shard="none", tp=1), after2)), straight)
