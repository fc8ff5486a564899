"""Profiling says how steady its measurements were and flags alike blocks measured unalike
(issue 13, item 5); on CPU it measures with the threads one training rank gets."""

from __future__ import annotations

import json
import re
import time

import pytest
import torch
from torch import nn

from pipeweave.cli.main import main
from pipeweave.models import ModelSpec
from pipeweave.profiler.measure import profile_model
from pipeweave.host import threads_per_rank


class Dense(nn.Linear):
    """A linear layer that can be told to stall, as a block on a busy core would."""

    def __init__(self, stall_s: float = 0.0) -> None:
        super().__init__(16, 16)
        self.stall_s = stall_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stall_s:
            time.sleep(self.stall_s)
        return super().forward(x)


def _spec(stall_s: float) -> ModelSpec:
    blocks = [Dense(), Dense(stall_s), Dense()]
    return ModelSpec(name="twins", blocks=tuple(blocks), block_names=("a", "b", "c"),
                     loss_fn=lambda out, y: ((out - y) ** 2).mean())


def test_alike_blocks_measured_unalike_are_reported() -> None:
    profile = profile_model(_spec(0.02), torch.randn(4, 16), repeats=3, warmup=1)
    (warning,) = profile.metadata["warnings"]
    # the fastest of the steady twins (a or c) against the stalled one
    assert re.match(r"blocks [ac] and b are alike", warning) and "busy" in warning
    assert set(profile.metadata["spread"]) == {"a", "b", "c"}


def test_steady_alike_blocks_give_no_warning() -> None:
    profile = profile_model(_spec(0.0), torch.randn(4, 16), repeats=3, warmup=1)
    assert profile.metadata["warnings"] == []


def test_profile_uses_one_ranks_threads_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "--model", "mlp", "--no-link", "--repeats", "2", "--json"]) == 0
    profile = json.loads(capsys.readouterr().out)
    assert profile["metadata"]["threads"] == threads_per_rank(2)
    assert main(["profile", "--model", "mlp", "--no-link", "--repeats", "2", "--local-ranks",
                 "1"]) == 0
    out = capsys.readouterr().out
    assert f"{threads_per_rank(1)} thread(s)" in out and "spread" in out
