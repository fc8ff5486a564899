"""``W`` of a linear without the autograd engine (``split_backward.linear_weight_gradient``).

Each case runs the same forward twice: once with one whole backward, once split (``I`` then
``W``), twice in a row so the second ``W`` accumulates into an existing ``.grad``; every
parameter's gradient must be bitwise the whole backward's. A counter on
``torch.autograd.backward`` shows which holders went through the engine.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import Tensor, nn

from pipeweave.split_backward import (input_gradient, linear_weight_gradient, recording,
                                      weight_gradient)

CASES = [(dtype, autocast, shape, bias)
         for dtype, autocast, shape, bias in itertools.product(
             (torch.float64, torch.float32), (False, True), ((7, 16), (3, 5, 16)), (True, False))
         if not (autocast and dtype == torch.float64)]


def _model(dtype: torch.dtype, bias: bool) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32, bias=bias), nn.GELU(), nn.LayerNorm(32),
                         nn.Linear(32, 8, bias=bias)).to(dtype)


def _grads(model: nn.Module, x: Tensor, g: Tensor, autocast: bool,
           split: bool) -> tuple[list[Tensor], int]:
    """Parameter gradients after two backwards from zero, and the engine calls the last W made."""
    model.zero_grad(set_to_none=True)
    calls = 0
    for _ in range(2):
        xi = x.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            with recording(model) as recorded:
                y = model(xi)
        if not split:
            y.backward(g.to(y.dtype))
            continue
        _, pending = input_gradient(model, xi, y, g.to(y.dtype), recorded)
        original = torch.autograd.backward
        counted: list[int] = []

        def counting(*args: object, **kwargs: object) -> None:
            counted.append(1)
            original(*args, **kwargs)  # type: ignore[arg-type]

        torch.autograd.backward = counting  # type: ignore[assignment]
        try:
            weight_gradient(pending)
        finally:
            torch.autograd.backward = original
        calls = len(counted)
    return [p.grad.clone() for p in model.parameters() if p.grad is not None], calls


@pytest.mark.parametrize("dtype,autocast,shape,bias", CASES)
def test_linear_W_is_bitwise_autograds_without_the_engine(dtype: torch.dtype, autocast: bool,
                                                          shape: tuple[int, ...],
                                                          bias: bool) -> None:
    model = _model(dtype, bias)
    x = torch.randn(*shape, dtype=dtype)
    g = torch.randn(*shape[:-1], 8, dtype=dtype)
    whole, _ = _grads(model, x, g, autocast, split=False)
    split, calls = _grads(model, x, g, autocast, split=True)
    assert len(whole) == len(split) == (6 if bias else 4)
    for expected, got in zip(whole, split):
        assert got.dtype == dtype  # autocast's bf16 gradient cast back, as ToCopyBackward does
        assert torch.equal(got, expected)
    assert calls == 1  # the LayerNorm only: both linears went around the engine


def test_a_graph_that_is_not_a_linear_is_left_to_autograd() -> None:
    norm = nn.LayerNorm(4).double()
    out = norm(torch.randn(3, 4, dtype=torch.float64))
    assert not linear_weight_gradient(out, torch.ones_like(out), list(norm.parameters()))
    assert all(p.grad is None for p in norm.parameters())


def test_a_linear_holding_only_part_of_its_parameters_is_left_to_autograd() -> None:
    """A weight tied elsewhere is not the holder's: the direct path must not touch it."""
    linear = nn.Linear(4, 4).double()
    out = linear(torch.randn(3, 4, dtype=torch.float64))
    assert not linear_weight_gradient(out, torch.ones_like(out), [linear.bias])
    assert linear.weight.grad is None and linear.bias.grad is None


def test_a_parameter_with_a_hook_is_left_to_autograd() -> None:
    linear = nn.Linear(4, 4).double()
    linear.weight.register_hook(lambda grad: grad * 2)
    out = linear(torch.randn(3, 4, dtype=torch.float64))
    assert not linear_weight_gradient(out, torch.ones_like(out), list(linear.parameters()))


def test_a_frozen_weight_leaves_the_bias_alone_on_the_direct_path() -> None:
    linear = nn.Linear(4, 4).double()
    linear.weight.requires_grad_(False)
    reference = nn.Linear(4, 4).double()
    reference.load_state_dict(linear.state_dict())
    reference.weight.requires_grad_(False)
    x = torch.randn(3, 4, dtype=torch.float64)
    reference(x).sum().backward()
    out = linear(x)
    assert linear_weight_gradient(out, torch.ones_like(out), [linear.bias])
    assert linear.weight.grad is None and torch.equal(linear.bias.grad, reference.bias.grad)
