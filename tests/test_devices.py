"""pipeweave.devices: where each rank computes, which backend carries its messages, and the
one-line refusal of a device this machine lacks."""

from __future__ import annotations

import pytest
import torch

from pipeweave import devices
from pipeweave.devices import backend_for, place, require_device, sharing_warning


@pytest.mark.parametrize(("device", "local_ranks", "gpus", "backend"), [
    ("cpu", 4, 0, "gloo"), ("cpu", 2, 8, "gloo"),
    ("cuda", 1, 1, "nccl"), ("cuda", 2, 2, "nccl"), ("cuda", 2, 8, "nccl"),
    ("cuda", 2, 1, "gloo"), ("cuda", 8, 4, "gloo"),  # ranks share GPUs: NCCL cannot
])
def test_backend_is_nccl_only_with_a_gpu_per_local_rank(device: str, local_ranks: int, gpus: int,
                                                         backend: str) -> None:
    assert backend_for(device, local_ranks=local_ranks, gpus=gpus) == backend


def test_ranks_share_the_gpus_round_robin_and_stage_messages_on_the_host() -> None:
    placed = [place("cuda", local_rank=r, local_ranks=3, gpus=2) for r in range(3)]
    assert [p.device for p in placed] == [torch.device("cuda", i) for i in (0, 1, 0)]
    assert {p.backend for p in placed} == {"gloo"}
    assert {p.wire for p in placed} == {torch.device("cpu")}
    assert placed[0].group_options() == {} and placed[0].barrier_options() == {}


def test_nccl_is_bound_to_the_ranks_gpu() -> None:
    placed = place("cuda", local_rank=1, local_ranks=2, gpus=2)
    assert placed.backend == "nccl" and placed.wire == torch.device("cuda", 1)
    assert placed.group_options() == {"device_id": torch.device("cuda", 1)}
    assert placed.barrier_options() == {"device_ids": [1]}


def test_cpu_ranks_use_gloo_on_the_host() -> None:
    placed = place("cpu", local_rank=3, local_ranks=4)
    assert (placed.device, placed.backend, placed.wire) == (torch.device("cpu"), "gloo",
                                                           torch.device("cpu"))


def test_sharing_is_a_warning_only_when_ranks_outnumber_gpus() -> None:
    assert sharing_warning("cuda", local_ranks=2, gpus=2) is None
    assert sharing_warning("cpu", local_ranks=4, gpus=1) is None
    line = sharing_warning("cuda", local_ranks=2, gpus=1)
    assert line is not None and "\n" not in line
    assert line.startswith("2 ranks on 1 GPU: the ranks share it (rank r on cuda:(r % 1))")


def test_no_gpu_is_one_line_naming_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "gpu_count", lambda: 0)
    with pytest.raises(ValueError, match=r"^--device cuda was asked but torch sees no CUDA "
                                         r"device .*; use --device cpu, or run on a machine"):
        require_device("cuda")
    with pytest.raises(ValueError, match="torch sees no CUDA device"):
        place("cuda", local_rank=0, local_ranks=1)
    with pytest.raises(ValueError, match="--device must be 'cpu' or 'cuda', got 'tpu'"):
        require_device("tpu")
    require_device("cpu")
