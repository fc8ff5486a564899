"""pipeweave.hf.blocks: a transformers causal LM as one-tensor blocks that compute what the
model's own forward computes, on the model's own parameters."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import transformers  # noqa: E402

import pipeweave.hf  # noqa: E402
from pipeweave.models import ModelSpec  # noqa: E402

from hf_jobs import LAYERS, SEQ, hf_model  # noqa: E402

FAMILIES = ["gpt2", "llama", "qwen2", "mistral"]


def _ids(batch: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (batch, SEQ), generator=torch.Generator().manual_seed(seed))


def _through_blocks(spec: ModelSpec, ids: torch.Tensor) -> torch.Tensor:
    """Block by block, as stages would: only the one tensor passes between blocks."""
    x = ids
    for block in spec.blocks:
        x = block(x)
        assert isinstance(x, torch.Tensor)
    return x


@pytest.mark.parametrize("sublayer", [False, True])
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_and_loss_equal_the_models_own(family: str, sublayer: bool) -> None:
    model = hf_model(family)
    spec = pipeweave.hf.blocks(model, sublayer=sublayer)
    ids = _ids()
    expected = model(ids, labels=ids, use_cache=False)
    logits = _through_blocks(spec, ids)
    assert torch.equal(logits, expected.logits)
    assert torch.equal(spec.loss_fn(logits, ids), expected.loss)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_eager_attention_uses_the_mask_it_builds(family: str) -> None:
    """Eager attention has no is_causal: the block's own causal mask must be right.

    Against the model's forward without its KV cache, as training runs it: with the cache
    (``model(ids)``'s default) GPT-2's eager attention multiplies the keys and values copied
    into the cache, and on an AVX-512 CPU (2026-11-27) that kernel path differed in the last
    bit (8e-17 in the logits) from the same attention on the layer's own keys."""
    model = hf_model(family, attn_implementation="eager")
    assert model.config._attn_implementation == "eager"
    ids = _ids()
    for sublayer in (False, True):
        spec = pipeweave.hf.blocks(model, sublayer=sublayer)
        assert torch.equal(_through_blocks(spec, ids), model(ids, use_cache=False).logits)


def test_mistral_sliding_window_mask_is_recomputed_per_block() -> None:
    model = hf_model("mistral", sliding_window=4)
    ids = _ids()
    logits = _through_blocks(pipeweave.hf.blocks(model, sublayer=True), ids)
    assert torch.equal(logits, model(ids, use_cache=False).logits)
    model.config.sliding_window = None  # the window must have mattered
    assert not torch.allclose(logits, model(ids, use_cache=False).logits)


@pytest.mark.parametrize("family", FAMILIES)
def test_blocks_hold_the_models_own_parameters(family: str) -> None:
    model = hf_model(family)
    for sublayer in (False, True):
        spec = pipeweave.hf.blocks(model, sublayer=sublayer)
        held = [p for block in spec.blocks for p in block.parameters()]
        assert len(held) == len({id(p) for p in held}), "a parameter in two blocks"
        assert {id(p) for p in held} == {id(p) for p in model.parameters()}


@pytest.mark.parametrize(("sublayer", "names"), [
    (False, ("embed", "layer0", "layer1", "head")),
    (True, ("embed", "layer0.attn", "layer0.ffn", "layer1.attn", "layer1.ffn", "head")),
])
def test_block_names(sublayer: bool, names: tuple[str, ...]) -> None:
    spec = pipeweave.hf.blocks(hf_model("llama"), sublayer=sublayer)
    assert spec.block_names == names and len(spec.blocks) == len(names)
    assert spec.name == "hf-llama" and spec.dataset is None and spec.tied == ()


def test_training_the_blocks_trains_the_model() -> None:
    model = hf_model("gpt2")
    spec = pipeweave.hf.blocks(model, sublayer=True)
    before = model.lm_head.weight.detach().clone()
    ids = _ids()
    spec.loss_fn(spec.sequential()(ids), ids).backward()
    torch.optim.SGD(spec.sequential().parameters(), lr=0.1).step()
    assert not torch.equal(model.lm_head.weight, before)


def test_tied_embeddings_are_listed() -> None:
    model = hf_model("gpt2", tied=True)
    assert model.lm_head.weight is model.transformer.wte.weight
    spec = pipeweave.hf.blocks(model)
    last = len(spec.blocks) - 1
    assert spec.tied == (("0.wte.weight", f"{last}.lm_head.weight"),)
    assert spec.tied_blocks() == ((0, last),)
    ids = _ids()
    assert torch.equal(spec.loss_fn(spec.sequential()(ids), ids), model(ids, labels=ids, use_cache=False).loss)


def test_other_models_are_refused() -> None:
    base = transformers.GPT2Model(transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2))
    with pytest.raises(TypeError, match="GPT2LMHeadModel, LlamaForCausalLM.*got GPT2Model"):
        pipeweave.hf.blocks(base)


def test_cross_attention_is_refused() -> None:
    model = hf_model("gpt2", add_cross_attention=True)
    with pytest.raises(ValueError, match="cross-attention"):
        pipeweave.hf.blocks(model)


def test_too_long_sequence_names_the_limit() -> None:
    spec = pipeweave.hf.blocks(hf_model("gpt2"))
    with pytest.raises(ValueError, match=f"exceeds the model's n_positions={SEQ}"):
        spec.blocks[0](torch.zeros(1, SEQ + 1, dtype=torch.int64))


def test_layer_count_follows_the_config() -> None:
    spec = pipeweave.hf.blocks(hf_model("qwen2"))
    assert len(spec.blocks) == LAYERS + 2
