"""``--device cuda`` from the command line on this (CPU) machine: no GPU is one line naming
the fix for ``train`` (both executors) and ``profile``; with fewer GPUs than ranks (torch.cuda
patched to show one) the run goes ahead with one warning, and ``profile`` skips the link
measurement with one note."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from pipeweave import devices
from pipeweave.cli import cmd_profile, cmd_train
from pipeweave.cli.main import main

TRAIN = ["train", "--model", "gpt-tiny", "--seq-len", "16", "--batch-size", "8",
         "--microbatches", "4", "--steps", "2", "--no-progress"]


class _Started(ValueError):
    """Raised by a patched executor: the run got that far (shown as a one-line error)."""


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The executors the command started (none should run for real here)."""
    calls: list[str] = []

    def executor(name: str) -> Any:
        def run(*_: Any, **__: Any) -> None:
            calls.append(name)
            raise _Started(f"{name} started")
        return run

    for name in ("launch_local", "run_local", "run_under_torchrun"):
        monkeypatch.setattr(cmd_train, name, executor(name))
    return calls


@pytest.mark.parametrize("command", [
    [*TRAIN, "--executor", "processes"], [*TRAIN, "--executor", "local"],
    ["profile", "--model", "mlp", "--no-link", "--no-runtime-costs"],
])
def test_cuda_without_a_gpu_is_one_line_naming_the_fix(
        command: list[str], started: list[str], tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    output = ["--output-dir", str(tmp_path)] if command[0] == "train" else []
    assert main([*command, *output, "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pipeweave: error: --device cuda was asked but torch sees no CUDA "
                          "device") and "use --device cpu" in err, err
    assert err.count("\n") == 1 and "Traceback" not in err and started == []


@pytest.mark.parametrize("torchrun", [False, True])
def test_ranks_outnumbering_gpus_share_them_with_one_warning(
        torchrun: bool, started: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "gpu_count", lambda: 1)
    if torchrun:  # torchrun --nproc-per-node 2 on a one-GPU machine: local rank 0 says it
        for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1"),
                            ("MASTER_PORT", "29500"), ("LOCAL_RANK", "0"),
                            ("LOCAL_WORLD_SIZE", "2")):
            monkeypatch.setenv(name, value)
    assert main([*TRAIN, "--stages", "2", "--device", "cuda", "--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert started == ["run_under_torchrun" if torchrun else "launch_local"]  # it went ahead
    warnings = [line for line in err.splitlines() if line.startswith("pipeweave: warning:")]
    assert warnings == ["pipeweave: warning: 2 ranks on 1 GPU: the ranks share it (rank r on "
                        "cuda:(r % 1)) and send their messages through host memory over gloo "
                        "instead of NCCL; right for trying a schedule, slower than one GPU per "
                        "rank"]


def test_profile_skips_the_link_with_one_gpu(capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "gpu_count", lambda: 1)
    measure = cmd_profile.profile_builtin
    monkeypatch.setattr(cmd_profile, "profile_builtin",  # the blocks measured here, on the CPU
                        lambda *a, **k: measure(*a, **{**k, "device": "cpu"}))

    def refuse(**_: Any) -> None:
        raise AssertionError("the link was measured")

    monkeypatch.setattr(cmd_profile, "measure_link", refuse)
    assert main(["profile", "--model", "mlp", "--device", "cuda", "--no-runtime-costs",
                 "--warmup", "0", "--repeats", "1", "--threads", "1"]) == 0
    out, err = capsys.readouterr()
    # one repeat without warm-up: on a busy machine (a loaded CI runner) the profiler may also
    # warn, rightly, that two alike blocks took very different times; that line is not this test's
    lines = [line for line in err.splitlines() if "the machine was probably busy" not in line]
    assert lines == ["note: the GPU link was not measured: it needs two GPUs and 1 is visible "
                     "(--no-link silences this)"]
    assert "fwd ms" in out and "link:" not in out
