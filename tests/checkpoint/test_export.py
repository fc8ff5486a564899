"""``pipeweave export``: a checkpoint's weights as a folder ``from_pretrained`` loads (HF
models) or a sharded state dict (built-in models), one output shard per checkpoint shard, never
the whole model in one dict (issue 26, item 3)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from pipeweave.cli.main import main
from pipeweave.models import build_model
from pipeweave.runtime import export_checkpoint, load_exported
from pipeweave.runtime.checkpoint.store import CheckpointError, resolve

TRAIN = ["train", "--executor", "local", "--batch-size", "4", "--no-progress",
         "--checkpoint-every", "3"]


def _checkpoint_tensors(run: Path) -> dict[str, torch.Tensor]:
    """Every parameter in a run's newest checkpoint, read with torch.load (not export's code)."""
    folder = resolve(run / "checkpoints")
    found: dict[str, torch.Tensor] = {}
    for shard in sorted(folder.glob("rank*.pt")):
        found.update(torch.load(shard, weights_only=True)["parameters"])
    return found


def _train(tmp_path: Path, name: str, *args: str) -> Path:
    run = tmp_path / name
    assert main([*TRAIN, *args, "--output-dir", str(run)]) == 0
    return run


@pytest.mark.parametrize("stages,schedule", [(2, "1f1b"), (4, "gpipe")])
def test_a_builtin_model_exports_the_state_dict_of_its_blocks(
        stages: int, schedule: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = _train(tmp_path, "run", "--model", "gpt-tiny", "--stages", str(stages),
                 "--schedule", schedule, "--steps", "3")
    import safetensors.torch

    written: list[int] = []
    save = safetensors.torch.save_file

    def counting(tensors: dict[str, torch.Tensor], path: str, **kw: Any) -> None:
        written.append(sum(t.numel() * t.element_size() for t in tensors.values()))
        save(tensors, path, **kw)

    monkeypatch.setattr(safetensors.torch, "save_file", counting)
    result = export_checkpoint(run, tmp_path / "out")
    trained = _checkpoint_tensors(run)
    whole = sum(t.numel() * t.element_size() for t in trained.values())
    # One file per stage, each holding its stage only: never the whole model in one dict.
    assert len(written) == len(result.files) == stages and sum(written) == whole
    assert max(written) < whole and result.largest_file_bytes == max(written)
    model = nn.Sequential(*build_model("gpt-tiny").blocks)
    model.load_state_dict(load_exported(tmp_path / "out"), strict=True)
    for key, value in model.state_dict().items():
        assert torch.equal(value, trained[key]), key
    initial = nn.Sequential(*build_model("gpt-tiny").blocks).state_dict()
    assert all(not torch.equal(value, initial[key]) for key, value in trained.items()
               if value.dim() == 2), "the weights did not train"


@pytest.mark.parametrize("family,stages", [("gpt2", 2), ("gpt2", 4), ("llama", 2), ("llama", 4)])
def test_an_hf_model_exports_a_folder_from_pretrained_loads(
        family: str, stages: int, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from pipeweave.hf.presets import HFPreset, hf_model

    torch.manual_seed(1)
    preset = HFPreset(tie_word_embeddings=True) if family == "gpt2" else HFPreset(kv_heads=2)
    start = hf_model(family, preset)
    start.save_pretrained(str(tmp_path / "pretrained"))
    run = _train(tmp_path, "run", "--hf-pretrained", str(tmp_path / "pretrained"),
                 "--stages", str(stages), "--steps", "3", "--seq-len", "16", "--lr", "1e-2")
    assert main(["export", "--checkpoint", str(run), "--out", str(tmp_path / "out")]) == 0
    loaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"),
                                                               dtype=torch.float32)
    trained = _checkpoint_tensors(run)
    # The test's own map from the blocks' names to HF's: the same module objects.
    import pipeweave.hf

    spec = pipeweave.hf.blocks(start)
    hf_names = {id(p): n for n, p in start.named_parameters(remove_duplicate=False)}
    checked = 0
    for index, block in enumerate(spec.blocks):
        for local, p in block.named_parameters():
            key = f"{index}.{local}"
            if key in trained:
                want = trained[key]
                assert torch.equal(loaded.get_parameter(hf_names[id(p)]), want), key
                assert not torch.equal(p.detach(), want), f"{key} did not train"
                checked += 1
    assert checked == len(trained)
    if family == "gpt2":  # tied: the head is the trained embedding
        assert loaded.lm_head.weight.data_ptr() == loaded.transformer.wte.weight.data_ptr()
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == stages


def test_refusals_name_the_value_and_leave_nothing(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    run = _train(tmp_path, "run", "--model", "mlp", "--stages", "2", "--steps", "3")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    assert main(["export", "--checkpoint", str(run), "--out", str(tmp_path / "full")]) != 0
    assert "not empty" in capsys.readouterr().err
    assert (tmp_path / "full" / "x").read_text() == "keep me"
    assert main(["export", "--checkpoint", str(run), "--out", str(tmp_path / "o1"),
                 "--model", "gpt-tiny"]) != 0
    err = capsys.readouterr().err
    assert "does not hold the parameters of model gpt-tiny" in err and "Traceback" not in err
    assert not (tmp_path / "o1").exists()
    assert main(["export", "--checkpoint", str(tmp_path / "nowhere"),
                 "--out", str(tmp_path / "o2")]) != 0
    assert "does not exist" in capsys.readouterr().err and not (tmp_path / "o2").exists()
    assert main(["export", "--checkpoint", str(run), "--out", str(tmp_path / "o3"),
                 "--pipeline", "1"]) != 0
    assert "--pipeline 1" in capsys.readouterr().err and not (tmp_path / "o3").exists()
    with pytest.raises(CheckpointError, match="does not record its model"):
        manifest = resolve(run / "checkpoints") / "MANIFEST.json"
        data = json.loads(manifest.read_text())
        del data["model"]
        manifest.write_text(json.dumps(data))
        export_checkpoint(run, tmp_path / "o4")


def test_avgpipe_exports_the_reference_model_or_the_pipeline_asked(tmp_path: Path) -> None:
    run = _train(tmp_path, "run", "--model", "mlp", "--schedule", "avgpipe", "--pipelines", "2",
                 "--stages", "2", "--steps", "3")
    shards = [torch.load(p, weights_only=True) for p in
              sorted(resolve(run / "checkpoints").glob("rank*.pt"))]
    reference = {k: v for s in shards for k, v in s["reference"].items()}
    second = {k: v for s in shards for k, v in s["pipelines"]["1"]["parameters"].items()}
    assert any(not torch.equal(reference[k], second[k]) for k in reference)
    export_checkpoint(run, tmp_path / "ref")
    export_checkpoint(run, tmp_path / "p1", pipeline=1)
    for folder, want in ((tmp_path / "ref", reference), (tmp_path / "p1", second)):
        got = load_exported(folder)
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k]) for k in want)
