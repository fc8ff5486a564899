"""Tests for the GPT-style decoder blocks and its registry presets."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from pipeweave.models import GPTConfig, ModelSpec, available_models, build_model

SMALL: dict[str, Any] = {"n_layers": 2, "d_model": 32, "d_ff": 64, "seq_len": 16}


def _tokens(batch: int = 3, seq: int = 16, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _run_blocks(spec: ModelSpec, x: torch.Tensor) -> torch.Tensor:
    for block in spec.blocks:
        x = block(x)
    return x


def test_presets_are_listed() -> None:
    assert {"gpt-tiny", "gpt-small"} <= set(available_models())


@pytest.mark.parametrize(("sublayer", "per_layer"), [(True, 2), (False, 1)])
def test_block_count_and_names(sublayer: bool, per_layer: int) -> None:
    spec = build_model("gpt-tiny", sublayer=sublayer)
    assert len(spec.blocks) == per_layer * 4 + 2 == GPTConfig(sublayer=sublayer).num_blocks
    assert spec.block_names[0] == "embed" and spec.block_names[-1] == "head"
    if sublayer:
        assert spec.block_names[1:3] == ("layer0.attn", "layer0.ffn")
    else:
        assert spec.block_names[1:3] == ("layer0", "layer1")
    assert spec.dataset == "stdlib-bytes"


def test_gpt_small_preset_shape() -> None:
    spec = build_model("gpt-small")
    assert len(spec.blocks) == 2 * 8 + 2
    out = spec.sequential()(_tokens(1, 128))
    assert out.shape == (1, 128, 256)


def test_shapes_through_each_block() -> None:
    spec = build_model("gpt-tiny", **SMALL)
    x = _tokens()
    h = spec.blocks[0](x)
    assert h.shape == (3, 16, 32) and h.dtype == torch.float32
    for block in spec.blocks[1:-1]:
        h = block(h)
        assert h.shape == (3, 16, 32)
    assert spec.blocks[-1](h).shape == (3, 16, 256)


def test_blocks_in_sequence_equal_sequential() -> None:
    spec = build_model("gpt-tiny", **SMALL)
    x = _tokens()
    seq = spec.sequential()
    torch.testing.assert_close(_run_blocks(spec, x), seq(x), rtol=0, atol=0)
    # Same parameter objects, not copies.
    block_params = [p for b in spec.blocks for p in b.parameters()]
    assert all(a is b for a, b in zip(block_params, seq.parameters(), strict=True))


def test_sublayer_and_whole_layer_compute_the_same_function() -> None:
    x = _tokens()
    fine = build_model("gpt-tiny", seed=3, sublayer=True, **SMALL)
    coarse = build_model("gpt-tiny", seed=3, sublayer=False, **SMALL)
    torch.testing.assert_close(fine.sequential()(x), coarse.sequential()(x))


def test_seed_determinism_and_global_rng_untouched() -> None:
    before = torch.get_rng_state()
    a = build_model("gpt-tiny", seed=7, **SMALL).sequential().state_dict()
    b = build_model("gpt-tiny", seed=7, **SMALL).sequential().state_dict()
    c = build_model("gpt-tiny", seed=8, **SMALL).sequential().state_dict()
    assert torch.equal(before, torch.get_rng_state())
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)
    assert any(not torch.equal(a[k], c[k]) for k in a if a[k].numel() > 1)


def test_float64() -> None:
    spec = build_model("gpt-tiny", dtype=torch.float64, **SMALL)
    assert all(p.dtype == torch.float64 for p in spec.sequential().parameters())
    x = _tokens()
    logits = spec.sequential()(x)
    assert logits.dtype == torch.float64
    loss = spec.loss_fn(logits, x)
    torch.autograd.backward(loss)
    assert loss.dtype == torch.float64 and loss.ndim == 0


def test_causal_masking() -> None:
    spec = build_model("gpt-tiny", dtype=torch.float64, **SMALL)
    model = spec.sequential().eval()
    x = _tokens(2, 16)
    changed = x.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 256
    a, b = model(x), model(changed)
    torch.testing.assert_close(a[:, :10], b[:, :10], rtol=0, atol=1e-12)
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_loss_is_mean_token_cross_entropy() -> None:
    spec = build_model("gpt-tiny", **SMALL)
    logits = torch.zeros(2, 5, 256)
    targets = torch.zeros(2, 5, dtype=torch.int64)
    assert spec.loss_fn(logits, targets).item() == pytest.approx(math.log(256))


def test_overlong_sequence_is_rejected() -> None:
    spec = build_model("gpt-tiny", **SMALL)
    with pytest.raises(ValueError, match="seq_len=16"):
        spec.blocks[0](_tokens(1, 17))


def test_unknown_model_and_bad_options() -> None:
    with pytest.raises(ValueError, match="'gpt-huge'.*gpt-tiny"):
        build_model("gpt-huge")
    with pytest.raises(ValueError, match="n_layer"):
        build_model("gpt-tiny", n_layer=2)
    with pytest.raises(ValueError, match="n_heads=5"):
        build_model("gpt-tiny", n_heads=5)
    with pytest.raises(ValueError, match="int64"):
        build_model("gpt-tiny", dtype=torch.int64)
