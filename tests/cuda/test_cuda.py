"""On a GPU (marked ``cuda``: skipped without one, tests/conftest.py; docs/gpu.md): every
registered schedule equals its reference on CUDA in float64, ranks sharing one GPU agree
with the single-process executor, and bf16-mixed, APC, clipping and a checkpoint moved from
the GPU to the CPU work there. Sized to run in well under three minutes on one H100:
``pytest -m cuda tests/cuda``.

The jobs and references are the CPU tests' own (tests/semantics/), with ``device="cuda"``:
synchronous schedules against non-pipelined training on the same GPU
(:func:`pipeweave.testing.reference_run` trains on the job's device), asynchronous ones
against their sequential oracle (on the CPU: float64 kernels of the two devices differ in
rounding only, far below the 1e-10 asked).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS / "semantics"), str(TESTS / "runtime"), str(TESTS / "checkpoint")]

from pipeweave.runtime import Job, RankResult, launch_local, run_local  # noqa: E402
from pipeweave.runtime.checkpoint.options import CheckpointOptions  # noqa: E402
from pipeweave.runtime.checkpoint.store import complete_checkpoints  # noqa: E402
from pipeweave.schedules import available_schedules  # noqa: E402
from pipeweave.testing import (assert_matches_reference, merged_parameters,  # noqa: E402
                               reference_run, relative_error)

from checkpoint_jobs import with_checkpoints  # noqa: E402
from runtime_jobs import gpt_job  # noqa: E402
from test_async_oracle import CASES, assert_equal_to_oracle, oracle_for  # noqa: E402
from test_async_oracle import make_job as async_job  # noqa: E402
from test_split_backward_equivalence import split_job  # noqa: E402

pytestmark = pytest.mark.cuda

SCHEDULES = sorted(info.name for info in available_schedules())
SYNCHRONOUS = {info.name for info in available_schedules() if info.synchronous}


def on_cuda(job: Job) -> Job:
    return dataclasses.replace(job, device="cuda")


def apart(got: list[RankResult], want: list[RankResult]) -> float:
    """The largest relative difference between two runs' parameters. Between processes on a
    GPU a tolerance, not bit identity: CUDA kernels with atomics need not repeat their
    rounding (on the CPU, tests/runtime/test_equivalence.py asserts identity)."""
    a, b = merged_parameters(got), merged_parameters(want)
    assert a.keys() == b.keys() and a
    return max(relative_error(a[name], b[name]) for name in b)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_schedule_matches_its_reference_on_cuda(schedule: str) -> None:
    if schedule in SYNCHRONOUS:
        job = on_cuda(split_job(schedule, 2))
        assert_matches_reference(run_local(job), reference_run(job),
                                 microbatches=job.plan.microbatches, tolerance=1e-10)
    else:
        assert schedule in CASES, f"asynchronous {schedule!r} has no oracle case"
        job = on_cuda(async_job(schedule, 2, "sgd"))
        assert_equal_to_oracle(run_local(job), oracle_for(schedule, job), job.plan.microbatches)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
def test_two_ranks_share_one_gpu(schedule: str) -> None:
    """Two processes on one GPU (gloo through host memory) equal the single-process executor
    on it and the reference."""
    job = on_cuda(split_job(schedule, 2))
    shared = launch_local(job, deadline_s=150)
    assert apart(shared, run_local(job)) < 1e-12
    assert_matches_reference(shared, reference_run(job), microbatches=job.plan.microbatches,
                             tolerance=1e-10)


@pytest.mark.timeout(150)
def test_a_rank_with_a_gpu_of_its_own_runs_nccl_without_warnings(tmp_path: Path) -> None:
    """``pipeweave train --device cuda --stages 1`` in a fresh process (so its ranks' stderr
    is the one captured): NCCL is bound to the rank's GPU (``device_id``), so it neither
    guesses the device from the rank nor warns at a barrier, and nothing says "warning"."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(TESTS.parent / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run(
        [sys.executable, "-m", "pipeweave", "train", "--model", "gpt-tiny", "--seq-len", "16",
         "--batch-size", "8", "--microbatches", "4", "--steps", "2", "--stages", "1",
         "--device", "cuda", "--no-progress", "--output-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Guessing device ID" not in done.stderr, done.stderr
    assert "device under current context" not in done.stderr, done.stderr
    assert "warning" not in done.stderr.lower(), done.stderr
    assert (tmp_path / "summary.json").is_file()


@pytest.mark.timeout(180)
def test_apc_across_two_ranks_on_one_gpu() -> None:
    """APC encodes on the GPU and its bytes travel through the host: the same numbers as the
    single-process executor's, within fp16 rounding of the uncompressed run."""
    job = on_cuda(gpt_job(depth=2, dtype="float32", optimizer="sgd", apc=True))
    shared = launch_local(job, deadline_s=150)
    assert apart(shared, run_local(job)) < 1e-4
    assert apart(shared, run_local(dataclasses.replace(job, apc=False))) < 1e-2


def test_bf16_mixed_trains_close_to_float32_on_cuda() -> None:
    job = on_cuda(gpt_job(depth=2, dtype="float32", optimizer="adam"))
    full = merged_parameters(run_local(job))
    mixed = merged_parameters(run_local(dataclasses.replace(job, precision="bf16-mixed")))
    assert all(t.dtype == torch.float32 for t in mixed.values())
    worst = max(float((mixed[n] - full[n]).abs().max()) for n in full)
    assert 0 < worst < 0.02  # autocast ran; Adam's steps are lr = 1e-3 each


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h2"])  # zb-h2: the global check's sum
def test_clipping_on_cuda_clips_as_on_the_cpu(schedule: str) -> None:
    options = {"post_validation": True} if schedule == "zb-h2" else {}
    job = on_cuda(gpt_job(depth=2, schedule=schedule, clip_grad_norm=1e-3,
                          plan_fields={"schedule_options": options}))
    clipped = run_local(job)
    assert apart(clipped, run_local(dataclasses.replace(job, clip_grad_norm=None))) > 1e-6
    assert apart(clipped, run_local(dataclasses.replace(job, device="cpu"))) < 1e-10


def test_checkpoint_written_on_the_gpu_resumes_on_the_cpu_and_back(tmp_path: Path) -> None:
    job = gpt_job(depth=2, steps=4, optimizer="adam")
    straight = run_local(job)
    run_local(with_checkpoints(on_cuda(job), directory=str(tmp_path / "gpu"), every=2))
    run_local(with_checkpoints(job, directory=str(tmp_path / "cpu"), every=2))
    for written, device in (("gpu", "cpu"), ("cpu", "cuda")):
        after2 = complete_checkpoints(tmp_path / written)[0]
        resumed = run_local(dataclasses.replace(
            job, device=device, checkpoint=CheckpointOptions(resume=str(after2))))
        # to rounding: bit for bit holds on one device (tests/checkpoint/test_resume.py)
        assert apart(resumed, straight) < 1e-10, (written, device)


def test_profile_on_cuda_measures_the_blocks_and_says_why_the_link_is_skipped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It stopped with a traceback in APC's codec (a CPU exponent beside a CUDA tensor)."""
    from pipeweave.cli.main import main
    from pipeweave.devices import gpu_count
    from pipeweave.profiler import Profile

    out = tmp_path / "profile.json"
    assert main(["profile", "--model", "gpt-tiny", "--device", "cuda", "--warmup", "0",
                 "--repeats", "1", "--no-runtime-costs", "--json-out", str(out)]) == 0
    profile = Profile.load(out)
    assert profile.device.startswith("cuda:") and profile.apc_bytes_per_second > 0
    err = capsys.readouterr().err
    assert ("the GPU link was not measured" in err) == (gpu_count() < 2), err
