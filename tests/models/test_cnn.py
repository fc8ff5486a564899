"""Tests for the digits MLP/CNN presets and the ModelSpec wrapper."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from pipeweave.models import ModelSpec, available_models, build_model


def _digits_like(batch: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.rand(batch, 64, generator=gen), torch.randint(0, 10, (batch,), generator=gen)


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_shapes_blocks_and_sequential(name: str) -> None:
    assert name in available_models()
    spec = build_model(name)
    assert len(spec.blocks) >= 4 and len(spec.block_names) == len(spec.blocks)
    assert spec.dataset == "digits"
    x, _ = _digits_like()
    h = x
    for block in spec.blocks:
        h = block(h)
    assert h.shape == (6, 10)
    torch.testing.assert_close(h, spec.sequential()(x), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_seed_and_float64(name: str) -> None:
    a = build_model(name, seed=1, dtype=torch.float64)
    b = build_model(name, seed=1, dtype=torch.float64)
    x, _ = _digits_like()
    out = a.sequential()(x.double())
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, b.sequential()(x.double()), rtol=0, atol=0)


def test_micro_batch_gradient_accumulation_matches_full_batch() -> None:
    # The loss is a batch mean, so sum(loss_mb * mb/B) over micro-batches == full-batch loss.
    spec = build_model("mlp", dtype=torch.float64)
    full = spec.sequential()
    accum = copy.deepcopy(full)
    x, y = _digits_like(8)
    x = x.double()
    torch.autograd.backward(spec.loss_fn(full(x), y))
    for xs, ys in zip(x.chunk(4), y.chunk(4), strict=True):
        torch.autograd.backward(spec.loss_fn(accum(xs), ys) * (len(ys) / len(y)))
    for p, q in zip(full.parameters(), accum.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None
        torch.testing.assert_close(p.grad, q.grad)


def test_cnn_rejects_wrong_input_width() -> None:
    with pytest.raises(ValueError, match=r"\[batch, 64\]"):
        build_model("cnn").blocks[0](torch.zeros(2, 63))


def test_from_blocks_list_and_sequential() -> None:
    layers = [nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2)]
    spec = ModelSpec.from_blocks(layers, nn.functional.cross_entropy)
    assert spec.name == "custom" and spec.block_names == ("0", "1", "2")
    assert spec.blocks == tuple(layers) and spec.dataset is None
    named = nn.Sequential()
    named.add_module("a", layers[0])
    named.add_module("b", layers[2])
    spec2 = ModelSpec.from_blocks(named, nn.functional.cross_entropy, name="mine")
    assert spec2.block_names == ("a", "b") and spec2.name == "mine"


def test_from_blocks_rejects_bad_input() -> None:
    with pytest.raises(TypeError, match="single Linear"):
        ModelSpec.from_blocks(nn.Linear(2, 2), nn.functional.mse_loss)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no blocks"):
        ModelSpec.from_blocks([], nn.functional.mse_loss)
    with pytest.raises(TypeError, match="block 1"):
        not_a_module: list[nn.Module] = [nn.ReLU(), torch.relu]  # type: ignore[list-item]
        ModelSpec.from_blocks(not_a_module, nn.functional.mse_loss)
    with pytest.raises(ValueError, match="duplicate"):
        ModelSpec.from_blocks([nn.ReLU(), nn.ReLU()], nn.functional.mse_loss, block_names="xx")
    with pytest.raises(ValueError, match="1 block_names for 2 blocks"):
        ModelSpec.from_blocks([nn.ReLU(), nn.ReLU()], nn.functional.mse_loss, block_names=["x"])


def test_unknown_model_names_the_value() -> None:
    with pytest.raises(ValueError, match="'resnet'.*cnn.*mlp"):
        build_model("resnet")
