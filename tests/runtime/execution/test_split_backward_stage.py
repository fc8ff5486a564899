"""The stage's split backward (I then W) against one whole backward with plain autograd.

``I`` must give the input gradient and compute no weight gradient; ``W`` must then give every
parameter exactly the gradient a whole backward gives (float64, bitwise on these blocks), for
the awkward cases too: a module whose output is changed in place afterwards, a parameter
shared by two modules, a module called twice, a parameter used directly by its block.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from pipeweave.runtime.execution.stage import StagePlace, StageRuntime, StageTraining


class Twice(nn.Module):
    """Calls its linear twice (its output is recorded twice: the stage output must cover it)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 6)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear(torch.tanh(self.linear(x)))


class Scaled(nn.Module):
    """A parameter used directly in its block's forward, around a child module."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 6))
        self.norm = nn.LayerNorm(6)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(x) * self.scale + x


def _blocks(kind: str) -> nn.Sequential:
    torch.manual_seed(0)
    if kind == "mlp":
        blocks = nn.Sequential(nn.Sequential(nn.Linear(4, 6), nn.GELU()), Scaled(),
                               nn.Sequential(nn.LayerNorm(6), nn.Linear(6, 3)))
    elif kind == "inplace":  # ReLU(inplace=True) rewrites the linear's recorded output
        blocks = nn.Sequential(nn.Sequential(nn.Linear(4, 6), nn.ReLU(inplace=True)),
                               nn.Sequential(nn.Linear(6, 3)))
    elif kind == "tied":  # one weight held by two modules
        a, b = nn.Linear(4, 4), nn.Linear(4, 4)
        b.weight = a.weight
        blocks = nn.Sequential(a, nn.Tanh(), b, nn.Tanh(), nn.Linear(4, 3))
    else:
        assert kind == "twice"
        blocks = nn.Sequential(nn.Linear(4, 6), Twice(), nn.Linear(6, 3))
    return blocks.double()


def _x(j: int) -> Tensor:
    return torch.randn(2, 4, generator=torch.Generator().manual_seed(10 + j), dtype=torch.float64)


def _dy(j: int) -> Tensor:
    return torch.randn(2, 3, generator=torch.Generator().manual_seed(20 + j), dtype=torch.float64)


def _whole(blocks: nn.Module, microbatches: list[int]) -> tuple[list[Tensor], list[Tensor]]:
    """Input gradients per micro-batch and summed parameter gradients, plain autograd."""
    reference = copy.deepcopy(blocks)
    inputs = []
    for j in microbatches:
        x = _x(j).requires_grad_(True)
        reference(x).backward(_dy(j))
        inputs.append(x.grad)
    return inputs, [p.grad for p in reference.parameters()]  # type: ignore[misc]


def _stage(blocks: nn.Module, *, recompute: bool) -> StageRuntime:
    return StageRuntime(place=StagePlace(1, (1, 1 + len(blocks))), blocks=blocks,
                        loss_fn=F.mse_loss,
                        training=StageTraining(recompute=recompute, split_backward=True))


@pytest.mark.parametrize("recompute", [False, True], ids=["graph", "recompute"])
@pytest.mark.parametrize("kind", ["mlp", "inplace", "tied", "twice"])
def test_I_then_W_equals_one_whole_backward(kind: str, recompute: bool) -> None:
    blocks = _blocks(kind)
    expected_inputs, expected_params = _whole(blocks, [0, 1])
    stage = _stage(blocks, recompute=recompute)
    for j in (0, 1):
        stage.forward((j, 0, 0), _x(j))
    got_inputs = [stage.backward_input(j, 0, _dy(j)) for j in (1, 0)]  # I out of order
    assert all(p.grad is None for p in blocks.parameters()), "I computed a weight gradient"
    assert stage.in_flight == 2  # both wait for their W
    stage.backward_weight(0, 0)
    stage.backward_weight(1, 0)
    assert stage.in_flight == 0
    assert torch.equal(got_inputs[1], expected_inputs[0])
    assert torch.equal(got_inputs[0], expected_inputs[1])
    for param, expected in zip(blocks.parameters(), expected_params):
        assert param.grad is not None
        torch.testing.assert_close(param.grad, expected, rtol=1e-13, atol=1e-15)


def test_W_takes_the_weight_matmuls_only_from_the_recorded_outputs() -> None:
    """On plain linear blocks every parameter is reached from its own module's output."""
    blocks = _blocks("mlp")
    stage = _stage(blocks, recompute=False)
    stage.forward((0, 0, 0), _x(0))
    stage.backward_input(0, 0, _dy(0))
    pending = next(iter(stage._pending.values())).weights
    assert pending.rest == []  # nothing falls back to the stage output
    assert len(pending.parts) == sum(1 for m in blocks.modules()
                                     if any(True for _ in m.parameters(recurse=False)))


def test_an_output_changed_in_place_falls_back_to_the_stage_output() -> None:
    blocks = _blocks("inplace")
    stage = _stage(blocks, recompute=False)
    stage.forward((0, 0, 0), _x(0))
    stage.backward_input(0, 0, _dy(0))
    pending = next(iter(stage._pending.values())).weights
    first = blocks[0][0]
    assert {id(p) for p in pending.rest} == {id(first.weight), id(first.bias)}


def test_the_last_stage_splits_its_loss_backward() -> None:
    blocks = _blocks("mlp")
    reference = copy.deepcopy(blocks)
    x, target = _x(0).requires_grad_(True), torch.zeros(2, 3, dtype=torch.float64)
    (F.mse_loss(reference(x), target) * 0.25).backward()
    stage = StageRuntime(place=StagePlace(2, (3, 6), is_last=True), blocks=blocks,
                         loss_fn=F.mse_loss, training=StageTraining(split_backward=True))
    stage.forward((0, 0, 0), _x(0), target=target, batch_rows=8)
    grad = stage.backward_input(0, 0, None, batch_rows=8)
    assert grad is not None and torch.equal(grad, x.grad)
    stage.backward_weight(0, 0)
    for param, expected in zip(blocks.parameters(), reference.parameters()):
        assert torch.equal(param.grad, expected.grad)
