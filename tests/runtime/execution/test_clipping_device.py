"""Gradient clipping and zb-h2's global check sum their squares on the rank's device: a CPU
sum beside CUDA gradients stopped ``--clip-grad-norm`` on a GPU. Checked on the meta device,
where every tensor shows where it was made (``OneDevice``: tests/runtime/test_apc.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from pipeweave.ir import Action, Op
from pipeweave.runtime import Plan
from pipeweave.runtime.execution.clipping import GradientClipper, squares
from pipeweave.runtime.execution.parts import make_schedule

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_apc import _OneDevice  # noqa: E402

META = torch.device("meta")


def _stage(*shapes: tuple[int, ...]) -> Any:
    module = nn.Module()
    for index, shape in enumerate(shapes):
        param = nn.Parameter(torch.empty(shape, device=META))
        param.grad = torch.empty(shape, device=META)
        module.register_parameter(f"p{index}", param)
    return SimpleNamespace(module=module)


def test_the_sum_of_squares_is_made_on_the_gradients_device() -> None:
    with _OneDevice(value=4.0) as mode:
        total = squares([torch.empty(3, device=META), torch.empty(2, 2, device=META)], META)
        empty = squares([], META)
    assert total.is_meta and empty.is_meta and total.dtype == torch.float64
    assert mode.mixed == []


def test_the_clipper_keeps_every_tensor_on_the_ranks_device() -> None:
    schedule = make_schedule(Plan.uniform(2, 1, schedule="1f1b", microbatches=2), 1)
    clipper = GradientClipper(rank=0, schedule=schedule, max_norm=1.0,
                              stages={0: _stage((4, 3), (4,))}, device=META)
    with _OneDevice(value=9.0) as mode:
        for _ in clipper.clip(Action(Op.STEP, 0, version=1), transport=None):  # type: ignore[arg-type]
            raise AssertionError("one rank: no all-reduce to wait for")
    assert mode.mixed == [] and clipper.norms == [3.0]
