"""The hf-* models of build_model: small random transformers models over the byte corpus."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

import transformers  # noqa: E402

from pipeweave.data import build_dataset  # noqa: E402
from pipeweave.models import available_models, build_model, default_seq_len  # noqa: E402

NAMES = ["hf-gpt2", "hf-llama", "hf-qwen2", "hf-mistral"]


def test_registered_beside_the_built_in_models() -> None:
    assert set(NAMES) <= set(available_models())


@pytest.mark.parametrize("name", NAMES)
def test_preset_trains_on_the_labels_corpus(name: str) -> None:
    spec = build_model(name, n_layers=2, seq_len=16, dtype=torch.float64)
    assert spec.dataset == "stdlib-bytes-labels" and spec.tied == ()
    assert spec.block_names == ("embed", "layer0", "layer1", "head")
    ids, labels = next(build_dataset(spec.dataset, batch_size=2, seq_len=16))
    logits = spec.sequential()(ids)
    assert logits.shape == (2, 16, 256) and logits.dtype == torch.float64
    loss = spec.loss_fn(logits, labels)
    assert abs(float(loss.detach()) - torch.log(torch.tensor(256.0)).item()) < 0.5  # random weights


def test_same_seed_same_weights_and_options() -> None:
    first = build_model("hf-llama", seed=3, sublayer=True, n_layers=1)
    again = build_model("hf-llama", seed=3, sublayer=True, n_layers=1)
    other = build_model("hf-llama", seed=4, sublayer=True, n_layers=1)
    for a, b, c in zip(first.sequential().parameters(), again.sequential().parameters(),
                       other.sequential().parameters()):
        assert torch.equal(a, b)
    assert not all(torch.equal(a, c) for a, c in zip(first.sequential().parameters(),
                                                     other.sequential().parameters()))
    assert first.block_names == ("embed", "layer0.attn", "layer0.ffn", "head")
    assert default_seq_len("hf-llama") == 64 and default_seq_len("hf-gpt2", seq_len=32) == 32


def test_tied_preset_is_listed() -> None:
    spec = build_model("hf-gpt2", n_layers=1, tie_word_embeddings=True)
    assert spec.tied == (("0.wte.weight", "2.lm_head.weight"),)


def test_unknown_option_lists_the_preset_fields() -> None:
    with pytest.raises(ValueError, match="HFPreset accepts"):
        build_model("hf-gpt2", n_embd=8)


def _config_file(tmp_path: Path, config: object, name: str = "config.json") -> str:
    path = tmp_path / name
    config.to_json_file(str(path))  # type: ignore[attr-defined]
    return str(path)


def test_config_file_gives_the_whole_config(tmp_path: Path) -> None:
    path = _config_file(tmp_path, transformers.LlamaConfig(
        vocab_size=300, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=2, max_position_embeddings=32))
    spec = build_model("hf-llama", config_file=path)
    assert len(spec.blocks) == 3 + 2
    assert spec.blocks[-1](torch.zeros(1, 4, 16)).shape == (1, 4, 300)


def test_config_file_of_another_family_names_the_model(tmp_path: Path) -> None:
    path = _config_file(tmp_path, transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2,
                                                          vocab_size=256))
    with pytest.raises(ValueError, match="is a gpt2 model; use --model hf-gpt2"):
        build_model("hf-llama", config_file=path)


def test_unsupported_architecture_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bert.json"
    path.write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    with pytest.raises(ValueError, match="model_type 'bert' is not supported; pipeweave.hf "
                                         "adapts gpt2, llama, mistral, qwen2"):
        build_model("hf-gpt2", config_file=str(path))


def test_vocabulary_must_cover_the_bytes(tmp_path: Path) -> None:
    path = _config_file(tmp_path, transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2,
                                                          vocab_size=100))
    with pytest.raises(ValueError, match="vocab_size=100 < 256"):
        build_model("hf-gpt2", config_file=path)
