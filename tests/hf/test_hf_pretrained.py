"""``--hf-pretrained DIR``: a local save_pretrained folder trains from its weights, each rank
reading only its own stage's tensors (issue 26, item 2). Nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402
import transformers  # noqa: E402

from pipeweave.cli.main import main  # noqa: E402
from pipeweave.hf.presets import DATASET, HFPreset, hf_model  # noqa: E402
from pipeweave.models import build_model  # noqa: E402
from pipeweave.runtime import BuiltinData  # noqa: E402

FAMILIES = {"gpt2": HFPreset(tie_word_embeddings=True), "llama": HFPreset(kv_heads=2)}
"""GPT-2 with tied embeddings (stored once), Llama sharded into many files."""


def _saved(tmp_path: Path, family: str) -> Path:
    torch.manual_seed(1)
    model = hf_model(family, FAMILIES[family])
    folder = tmp_path / family
    sharded = {"max_shard_size": "100KB"} if family == "llama" else {}
    model.save_pretrained(str(folder), **sharded)
    return folder


def _from_pretrained(folder: Path, family: str) -> torch.nn.Module:
    model_class = getattr(transformers, "GPT2LMHeadModel" if family == "gpt2"
                          else "LlamaForCausalLM")
    model: torch.nn.Module = model_class.from_pretrained(str(folder), dtype=torch.float32)
    return model


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_stage_reads_only_its_own_tensors_and_equals_from_pretrained(
        family: str, tmp_path: Path) -> None:
    folder = _saved(tmp_path, family)
    spec = build_model(f"hf-{family}", pretrained=str(folder), meta=True)
    reference = _from_pretrained(folder, family)
    loader = spec.init
    blocks = len(spec.blocks)  # embed, 4 layers, head
    first = spec.stage_blocks(0, 3, "cpu")
    read: list[str] = loader.tensors.read  # type: ignore[union-attr]
    later = (".layers.2.", ".layers.3.", ".h.2.", ".h.3.", "ln_f", "model.norm", "lm_head")
    assert read and not any(part in name for name in read for part in later), read
    read.clear()
    second = spec.stage_blocks(3, blocks, "cpu")  # layers 2, 3 and the head
    earlier = (".layers.0.", ".layers.1.", ".h.0.", ".h.1.")
    assert read and not any(part in name for name in read for part in earlier), read
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    logits = torch.nn.Sequential(*first, *second)(ids)
    assert torch.equal(logits, reference(ids).logits)
    if family == "gpt2":  # the head alone holds the embedding's loaded value
        assert torch.equal(second[-1].lm_head.weight, reference.lm_head.weight)


@pytest.mark.distributed
@pytest.mark.timeout(300)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_first_step_loss_equals_the_models_own(family: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    folder = _saved(tmp_path, family)
    code = main(["train", "--hf-pretrained", str(folder), "--stages", "2", "--steps", "1",
                 "--batch-size", "4", "--microbatches", "1", "--seq-len", "16",
                 "--schedule", "gpipe", "--no-progress", "--output-dir", str(tmp_path / "run")])
    assert code == 0, capsys.readouterr().err
    loss = json.loads((tmp_path / "run" / "summary.json").read_text())["losses"][0]
    inputs, labels = next(iter(BuiltinData(DATASET, batch_size=4, seq_len=16)()))
    with torch.no_grad():
        want = float(_from_pretrained(folder, family)(inputs, labels=labels).loss)
    assert loss == pytest.approx(want, rel=1e-6, abs=1e-6)


def test_a_bad_folder_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["train", "--hf-pretrained", str(tmp_path / "empty")]) != 0
    assert "no config.json" in capsys.readouterr().err
    folder = _saved(tmp_path, "gpt2")
    (folder / "model.safetensors").unlink()
    assert main(["train", "--hf-pretrained", str(folder)]) != 0
    err = capsys.readouterr().err
    assert "model.safetensors" in err and "Traceback" not in err
    assert main(["train", "--hf-pretrained", str(folder), "--hf-config",
                 str(folder / "config.json")]) != 0
    assert "not both" in capsys.readouterr().err
