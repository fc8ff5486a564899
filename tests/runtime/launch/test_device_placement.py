"""``--device cuda`` reaches every launcher, checked without a GPU (torch.cuda's answers
patched): the single-process executor builds every rank on the GPU, a distributed rank binds
NCCL to its GPU (``device_id``, so NCCL neither guesses nor warns), ranks that share a GPU
use gloo, and a machine without a GPU stops in ``prepare`` with one line."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from pipeweave.runtime import run_local
from pipeweave.runtime.launch import rank as rank_module
from pipeweave.runtime.launch import single_process
from pipeweave.runtime.launch.prepare import prepare

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from runtime_jobs import mlp_job  # noqa: E402


class _Stop(Exception):
    """Raised where the test has seen what it needs (nothing on a GPU runs)."""


def _gpus(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)


def test_single_process_executor_builds_every_rank_on_the_gpu(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _gpus(monkeypatch, 1)
    devices: list[torch.device] = []

    def assemble(prepared: Any, rank: int, *, device: torch.device, **_: Any) -> None:
        devices.append(device)
        raise _Stop

    monkeypatch.setattr(single_process, "assemble_rank", assemble)
    with pytest.raises(_Stop):
        run_local(dataclasses.replace(mlp_job(depth=2), device="cuda"))
    assert devices == [torch.device("cuda", 0)]  # it trained on the CPU, without a word


@pytest.mark.parametrize(("local_rank", "gpus", "backend", "extra"), [
    (1, 2, "nccl", {"device_id": torch.device("cuda", 1)}),
    (1, 1, "gloo", {}),  # two ranks, one GPU: NCCL cannot put both on it
])
def test_process_group_is_bound_to_the_ranks_gpu(
        monkeypatch: pytest.MonkeyPatch, local_rank: int, gpus: int, backend: str,
        extra: dict[str, Any]) -> None:
    _gpus(monkeypatch, gpus)
    prepared = prepare(dataclasses.replace(mlp_job(depth=2), device="cuda"))
    seen: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def init(*args: Any, **kwargs: Any) -> None:
        seen.append((args, kwargs))
        raise _Stop

    monkeypatch.setattr(dist, "init_process_group", init)
    with pytest.raises(_Stop):
        rank_module.run_rank(prepared, rank=local_rank, world_size=2, local_rank=local_rank,
                             local_world_size=2, store=dist.HashStore())
    ((args, kwargs),) = seen
    assert args == (backend,)
    assert {k: v for k, v in kwargs.items() if k == "device_id"} == extra


def test_no_gpu_stops_before_anything_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    _gpus(monkeypatch, 0)
    job = dataclasses.replace(mlp_job(depth=2), device="cuda")
    with pytest.raises(ValueError, match="--device cuda was asked but torch sees no CUDA device"):
        prepare(job)
    with pytest.raises(ValueError, match="torch sees no CUDA device"):
        run_local(job)
