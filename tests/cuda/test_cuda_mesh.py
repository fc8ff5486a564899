"""On a GPU (marked ``cuda``): checkpoints of sharded (``--shard full``) and tensor-parallel
(``tp=2``) runs, written on the CPU, resume on the GPU; and processes sharing one GPU train
sharded and tensor-parallel stages as the same processes do on the CPU (gloo runs the
all-gather, reduce-scatter and all-reduce on CUDA tensors: ``benchmarks/gpu/gloo_cuda_probe.py``).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS / "runtime"), str(TESTS / "checkpoint")]

from pipeweave.runtime import Job, launch_local, run_local  # noqa: E402
from pipeweave.runtime.checkpoint.options import CheckpointOptions  # noqa: E402
from pipeweave.runtime.checkpoint.store import complete_checkpoints  # noqa: E402
from pipeweave.runtime.launch.prepare import TP_TORCH  # noqa: E402
from pipeweave.testing import merged_parameters, relative_error  # noqa: E402

from checkpoint_jobs import gpt_job, with_checkpoints  # noqa: E402

pytestmark = [pytest.mark.cuda, pytest.mark.timeout(300)]
MESHES = [{"width": 2, "shard": "full"},
          pytest.param({"tp": 2}, marks=pytest.mark.skipif(
              torch.__version__ < TP_TORCH, reason=f"tp needs torch {TP_TORCH} or newer"))]


def _job(**plan_fields: Any) -> Job:
    """gpt-tiny, float64, Adam, 4 steps (tests/checkpoint/test_sharded_resume.py's job)."""
    return gpt_job(depth=2, steps=4, optimizer="adam", plan_fields=plan_fields)


@pytest.mark.parametrize("mesh", MESHES)
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


@pytest.mark.parametrize("mesh", MESHES)
def test_sharded_and_tensor_parallel_processes_sharing_the_gpu_train_as_on_the_cpu(
        mesh: dict[str, Any]) -> None:
    """Four processes on one GPU: FSDP2's all-gather and reduce-scatter and the tensor-parallel
    collectives run over gloo on CUDA tensors (pipeline messages through host memory)."""
    job = _job(**mesh)
    on_gpu = launch_local(dataclasses.replace(job, device="cuda"), deadline_s=250)
    got, want = merged_parameters(on_gpu), merged_parameters(launch_local(job, deadline_s=250))
    assert got.keys() == want.keys() and got
    assert max(relative_error(got[name], want[name]) for name in want) < 1e-10
