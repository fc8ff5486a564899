"""One stage's forward, backward and stash (runtime/execution/stage.py) against plain autograd.

Every expectation comes from running deep copies of the same blocks with torch autograd, in
float64, under the same random seeds.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from pipeweave.runtime.execution.stage import StageError, StagePlace, StageRuntime, StageTraining

BATCH_ROWS = 8  # rows of the whole batch; each micro-batch below has 2


def _blocks() -> nn.Sequential:
    """Two blocks, the first with dropout so that a recomputation must replay the RNG."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Sequential(nn.Linear(4, 6), nn.Dropout(0.5)),
                         nn.Sequential(nn.Tanh(), nn.Linear(6, 3))).double()


def _stage(blocks: nn.Module, *, recompute: bool, is_last: bool = False,
           loss_scale: float = 1.0) -> StageRuntime:
    return StageRuntime(place=StagePlace(1, (2, 4), is_last=is_last), blocks=blocks,
                        loss_fn=F.mse_loss,
                        training=StageTraining(recompute=recompute, loss_scale=loss_scale))


def _x(j: int, rows: int = 2) -> Tensor:
    return torch.randn(rows, 4, generator=torch.Generator().manual_seed(10 + j),
                       dtype=torch.float64)


def _dy(j: int, rows: int = 2) -> Tensor:
    return torch.randn(rows, 3, generator=torch.Generator().manual_seed(20 + j),
                       dtype=torch.float64)


def _reference(blocks: nn.Module, j: int) -> tuple[Tensor, Tensor, list[Tensor]]:
    """Output, input gradient and parameter gradients of micro-batch ``j`` alone."""
    reference = copy.deepcopy(blocks)
    x = _x(j).requires_grad_(True)
    torch.manual_seed(1000 + j)
    output = reference(x)
    output.backward(_dy(j))
    grads = [p.grad for p in reference.parameters()]
    assert x.grad is not None and all(g is not None for g in grads)
    return output.detach(), x.grad, grads  # type: ignore[return-value]


@pytest.mark.parametrize("recompute", [False, True], ids=["graph", "recompute"])
def test_forward_and_backward_equal_autograd_on_the_same_blocks(recompute: bool) -> None:
    blocks = _blocks()
    stage = _stage(blocks, recompute=recompute)
    outputs: dict[int, Tensor] = {}
    for j in (0, 1, 2):  # three micro-batches in flight, their backwards out of order
        torch.manual_seed(1000 + j)
        output = stage.forward((j, 0, 0), _x(j))
        assert output is not None  # not the last stage: the activation to send on
        outputs[j] = output
    assert stage.in_flight == 3 and stage.peak_stashed == 3
    torch.randn(100)  # move the global RNG: a recomputation must not depend on it
    for j in (1, 0, 2):
        for param in blocks.parameters():
            param.grad = None
        grad_input = stage.backward(j, 0, _dy(j))
        output, expected_input_grad, expected_grads = _reference(blocks, j)
        assert torch.equal(outputs[j], output)
        assert not outputs[j].requires_grad  # what is sent on carries no graph
        assert grad_input is not None and torch.equal(grad_input, expected_input_grad)
        for param, expected in zip(blocks.parameters(), expected_grads):
            assert param.grad is not None and torch.equal(param.grad, expected)
    assert stage.in_flight == 0 and stage.peak_stashed == 3
    with pytest.raises(StageError, match="stage 1 has no stashed forward for micro-batch 1"):
        stage.backward(1, 0, _dy(1))


@pytest.mark.parametrize("recompute", [False, True], ids=["graph", "recompute"])
def test_the_stash_holds_inputs_and_only_without_recomputation_outputs(recompute: bool) -> None:
    stage = _stage(_blocks(), recompute=recompute)
    for j in range(3):
        stage.forward((j, 0, 0), _x(j))
    per_microbatch = 2 * 4 * 8 + (0 if recompute else 2 * 3 * 8)  # float64 input (+ output)
    assert stage.peak_stashed_bytes == 3 * per_microbatch
    for j in range(3):
        stage.backward(j, 0, _dy(j))
    stage.forward((3, 0, 0), _x(3))  # freed: the peak does not grow with one in flight
    assert stage.peak_stashed_bytes == 3 * per_microbatch and stage.in_flight == 1


def test_pieces_of_one_microbatch_are_stashed_as_one_and_backpropagate_together() -> None:
    """The Slicer's halves: one backward splits the incoming gradient by rows and concatenates
    the input gradients, as autograd does for the whole micro-batch."""
    blocks = _blocks().eval()  # no dropout: halves and whole must run the same function
    stage = _stage(blocks, recompute=False)
    x, dy = _x(0, rows=4), _dy(0, rows=4)
    stage.forward((0, 1, 0), x[:2])
    stage.forward((0, 2, 0), x[2:])
    assert stage.in_flight == 2 and stage.peak_stashed == 1  # two pieces, one micro-batch
    grad_input = stage.backward(0, 0, dy)
    reference = copy.deepcopy(blocks)
    whole = x.clone().requires_grad_(True)
    reference(whole).backward(dy)
    assert grad_input is not None and whole.grad is not None
    torch.testing.assert_close(grad_input, whole.grad, rtol=0, atol=1e-12)
    for param, expected in zip(blocks.parameters(), reference.parameters()):
        torch.testing.assert_close(param.grad, expected.grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("recompute", [False, True], ids=["graph", "recompute"])
def test_last_stage_reports_the_batch_weighted_loss_and_scales_its_gradient(
        recompute: bool) -> None:
    """PipeDream with M = 4 micro-batches per batch and one per update: the reported loss is
    ``mse * rows / batch_rows``; the gradient is that loss's times ``loss_scale = M / K = 4``,
    the gradient of the mean loss over the one micro-batch the update sees."""
    blocks = _blocks().eval()
    stage = _stage(blocks, recompute=recompute, is_last=True, loss_scale=4.0)
    target = torch.randn(2, 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    assert stage.forward((7, 0, 0), _x(7), target=target, batch_rows=BATCH_ROWS) is None
    grad_input = stage.backward(7, 0, None, batch_rows=BATCH_ROWS)
    reference = copy.deepcopy(blocks)
    x = _x(7).requires_grad_(True)
    loss = F.mse_loss(reference(x), target)
    assert stage.losses == {7: loss.item() * 2 / BATCH_ROWS}
    (loss * (2 / BATCH_ROWS) * 4.0).backward()
    assert grad_input is not None and x.grad is not None
    torch.testing.assert_close(grad_input, x.grad, rtol=0, atol=1e-15)
    for param, expected in zip(blocks.parameters(), reference.parameters()):
        torch.testing.assert_close(param.grad, expected.grad, rtol=0, atol=1e-15)
        assert param.grad is not None and expected.grad is not None
        assert not torch.allclose(param.grad, expected.grad / 4.0)
    with pytest.raises(StageError, match="last stage 1 got no target for micro-batch 8"):
        stage.forward((8, 0, 0), _x(8), batch_rows=BATCH_ROWS)
