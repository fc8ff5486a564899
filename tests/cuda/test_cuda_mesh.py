"""On a GPU (marked ``cuda``): checkpoints of sharded (``--shard full``) and tensor-parallel
(``tp=2``) runs, written on the CPU, resume on the GPU; processes that would share the GPU
for sharding or tensor parallelism are refused in one line before anything starts.

FSDP2 and tensor parallelism themselves need one GPU per process (NCCL), so on a one-GPU
machine their collectives are not run on CUDA: docs/gpu.md says so.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS / "runtime"), str(TESTS / "checkpoint")]

from pipeweave.devices import gpu_count  # noqa: E402
from pipeweave.runtime import Job, launch_local, run_local  # noqa: E402
from pipeweave.runtime.checkpoint.options import CheckpointOptions  # noqa: E402
from pipeweave.runtime.checkpoint.store import complete_checkpoints  # noqa: E402
from pipeweave.testing import merged_parameters, relative_error  # noqa: E402

from checkpoint_jobs import gpt_job, with_checkpoints  # noqa: E402

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(300)]


def _job(**plan_fields: Any) -> Job:
    """gpt-tiny, float64, Adam, 4 steps (tests/checkpoint/test_sharded_resume.py's job)."""
    return gpt_job(depth=2, steps=4, optimizer="adam", plan_fields=plan_fields)


@pytest.mark.parametrize("mesh", [{"width": 2, "shard": "full"}, {"tp": 2}])
def test_a_sharded_or_tensor_parallel_checkpoint_resumes_on_the_gpu(
        tmp_path: Path, mesh: dict[str, Any]) -> None:
    job = _job(**mesh)
    straight = launch_local(with_checkpoints(job, directory=str(tmp_path), every=2),
                            deadline_s=250)  # on the CPU, 4 processes over gloo
    after2 = complete_checkpoints(tmp_path)[0]
    on_gpu = dataclasses.replace(
        job, device="cuda", checkpoint=CheckpointOptions(resume=str(after2)),
        plan=dataclasses.replace(job.plan, width=1, shard="none", tp=1))
    got, want = merged_parameters(run_local(on_gpu)), merged_parameters(straight)
    assert got.keys() == want.keys() and got
    # another mesh and another device: the same gradients summed in another order
    assert max(relative_error(got[name], want[name]) for name in want) < 1e-10


@pytest.mark.parametrize(("flags", "refused"), [(["--mesh", "pp=2,dp=2", "--shard", "full"],
                                                 "--shard full"),
                                                (["--mesh", "pp=2,tp=2"], "tp=2")])
def test_processes_sharing_the_gpu_are_refused_sharding_in_one_line(
        capsys: pytest.CaptureFixture[str], flags: list[str], refused: str) -> None:
    if gpu_count() >= 4:
        pytest.skip("every process has a GPU of its own here")
    from pipeweave.cli.main import main

    assert main(["train", "--model", "gpt-tiny", "--device", "cuda", *flags, "--steps", "1",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"pipeweave: error: {refused} on CUDA needs a "
                                               "GPU per process"), err
    assert not Path("runs").exists()
