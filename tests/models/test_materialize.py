"""A stage built alone from the meta device equals the same blocks of a whole build, bit for
bit (issue 26, item 1): the built-in models, Hugging Face models and a user's meta blocks."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from pipeweave.models import ModelSpec, build_model
from pipeweave.models.materialize import block_seed, is_meta, meta_copy
from pipeweave.testing import TiedHead


def _assert_equal_blocks(got: nn.Module, want: nn.Module) -> None:
    got_state, want_state = got.state_dict(), want.state_dict()
    assert list(got_state) == list(want_state)
    for name in want_state:
        assert not got_state[name].is_meta, name
        assert torch.equal(got_state[name], want_state[name]), name


def _assert_stages_equal_whole(spec: ModelSpec, cuts: list[tuple[int, int]]) -> None:
    whole = spec.materialized("cpu")
    for start, end in cuts:
        for got, want in zip(spec.stage_blocks(start, end, "cpu"), whole.blocks[start:end]):
            _assert_equal_blocks(got, want)


@pytest.mark.parametrize("name,overrides", [
    ("gpt-tiny", {}), ("gpt-tiny", {"sublayer": False}), ("cnn", {}), ("mlp", {})])
def test_a_builtin_stage_built_alone_equals_the_whole_build(name: str,
                                                            overrides: dict[str, Any]) -> None:
    spec = build_model(name, seed=5, meta=True, **overrides)
    assert all(is_meta(block) for block in spec.blocks)  # nothing allocated
    blocks = len(spec.blocks)
    _assert_stages_equal_whole(spec, [(i, i + 1) for i in range(blocks)] + [(1, blocks - 1)])
    # build_model without meta gives those same values, whole, on the CPU
    real = build_model(name, seed=5, **overrides)
    for got, want in zip(spec.stage_blocks(0, blocks, "cpu"), real.blocks):
        _assert_equal_blocks(got, want)


def test_the_values_follow_the_seed_and_the_initialisation_is_the_models() -> None:
    a, b = build_model("gpt-tiny", seed=0), build_model("gpt-tiny", seed=1)
    assert not torch.equal(a.blocks[1].qkv.weight, b.blocks[1].qkv.weight)
    attention = a.blocks[1]
    assert torch.equal(attention.ln.weight, torch.ones_like(attention.ln.weight))
    assert float(attention.qkv.weight.detach().std()) == pytest.approx(0.02, rel=0.05)
    assert torch.equal(attention.qkv.bias, torch.zeros_like(attention.qkv.bias))
    # a whole layer and its two sub-layer blocks share module names, hence values
    whole_layer = build_model("gpt-tiny", seed=0, sublayer=False).blocks[1]
    _assert_equal_blocks(whole_layer.attn, a.blocks[1])
    _assert_equal_blocks(whole_layer.ffn, a.blocks[2])


def test_block_seeds_are_stable_and_distinct() -> None:
    assert block_seed(0, "layer0.attn") == block_seed(0, "layer0.attn")
    assert len({block_seed(s, n) for s in (0, 1) for n in ("embed", "head")}) == 4
    assert 0 <= block_seed(7, "x") < 2 ** 63


@pytest.mark.parametrize("name,overrides", [
    ("hf-llama", {}), ("hf-gpt2", {"tie_word_embeddings": True}),
    ("hf-gpt2", {"tie_word_embeddings": True, "sublayer": True})])
def test_a_hugging_face_stage_built_alone_equals_the_whole_build(
        name: str, overrides: dict[str, Any]) -> None:
    pytest.importorskip("transformers")
    spec = build_model(name, seed=2, meta=True, **overrides)
    assert all(is_meta(block) for block in spec.blocks)
    blocks = len(spec.blocks)
    _assert_stages_equal_whole(spec, [(i, i + 1) for i in range(blocks)])
    whole = spec.materialized("cpu")
    if spec.tied:  # the head alone holds the embedding's value, and a whole build one tensor
        head = spec.stage_blocks(blocks - 1, blocks, "cpu")[0]
        assert torch.equal(head.lm_head.weight, whole.blocks[0].wte.weight)
        assert whole.blocks[0].wte.weight is whole.blocks[-1].lm_head.weight
        assert whole.tied == spec.tied


def test_hugging_face_buffers_are_recomputed_and_the_loss_starts_at_chance() -> None:
    pytest.importorskip("transformers")
    from pipeweave.hf.presets import PRESETS, hf_model

    spec = build_model("hf-llama", seed=0)
    reference = hf_model(*PRESETS["hf-llama"])  # built with values by transformers itself
    got = dict(spec.sequential().named_buffers())
    for name, buffer in reference.model.rotary_emb.named_buffers():
        found = [b for key, b in got.items() if key.endswith(f"rotary.{name}")]
        assert found and all(torch.equal(b, buffer) for b in found), name
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        loss = float(spec.loss_fn(spec.sequential()(ids), ids))
    assert abs(loss - torch.log(torch.tensor(256.0)).item()) < 0.2  # GPT-2-style small init


def _user_blocks(device: str) -> ModelSpec:
    with torch.device(device):
        embed = nn.Embedding(16, 8)
        blocks = [embed, nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8)),
                  nn.BatchNorm1d(4), TiedHead(embed.weight)]
    return ModelSpec.from_blocks(blocks, nn.functional.mse_loss, block_names=["e", "l", "b", "h"])


def test_a_users_meta_blocks_are_made_real_with_torchs_own_initialisation() -> None:
    spec = _user_blocks("meta")
    assert spec.tied == (("0.weight", "3.weight"),)
    _assert_stages_equal_whole(spec, [(0, 1), (1, 2), (2, 3), (3, 4), (1, 4)])
    whole = spec.materialized("cpu")
    assert whole.blocks[0].weight is whole.blocks[3].weight  # the tie stays one tensor
    norm = whole.blocks[2]
    assert torch.equal(norm.running_var, torch.ones(4))  # reset_parameters, buffers included
    assert torch.equal(norm.num_batches_tracked, torch.tensor(0))
    stage = spec.stage_blocks(0, 4, "cpu")
    assert stage[0].weight is stage[3].weight


def test_a_users_real_blocks_are_copied_as_they_are() -> None:
    torch.manual_seed(0)
    spec = _user_blocks("cpu")
    assert spec.materialized("cpu") is spec
    copies = spec.stage_blocks(0, 4, "cpu")
    for got, want in zip(copies, spec.blocks):
        assert got is not want
        _assert_equal_blocks(got, want)
    assert copies[0].weight is copies[3].weight


def test_meta_copies_allocate_nothing_and_keep_ties() -> None:
    spec = _user_blocks("cpu")
    copies = meta_copy(spec.blocks)
    assert all(is_meta(block) for block in copies)
    assert copies[0].weight is copies[3].weight
    assert not is_meta(spec.blocks[0])


def test_building_a_stage_leaves_the_callers_generator_alone() -> None:
    spec = build_model("gpt-tiny", meta=True)
    torch.manual_seed(0)
    want = torch.rand(3)
    torch.manual_seed(0)
    spec.stage_blocks(0, 3, "cpu")
    assert torch.equal(torch.rand(3), want)


def test_building_a_stage_reseeds_no_accelerator_generator(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the CPU generator is seeded per submodule: ``torch.manual_seed`` would reseed every
    CUDA device's generator as well, which the fork of the CPU state does not restore."""
    reseeded: list[int] = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", reseeded.append)
    spec = build_model("gpt-tiny", meta=True)
    spec.stage_blocks(0, 3, "cpu")
    assert reseeded == []


def test_a_meta_build_of_a_builtin_model_runs_no_init() -> None:
    """torch's init functions on meta tensors import torch._dynamo and sympy (~80 MB in every
    process that builds a model); a built-in model's meta build runs none."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys; from pipeweave.models import build_model; "
            "spec = build_model('gpt-tiny', meta=True); "
            "print('torch._dynamo' in sys.modules, 'sympy' in sys.modules)")
    src = Path(__file__).resolve().parents[2] / "src"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": str(src)}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]
