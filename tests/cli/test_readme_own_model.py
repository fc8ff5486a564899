"""The README's "Your model, your data, your weights back" commands run as written (fewer
steps), in order, on a Llama saved here with ``save_pretrained`` and a text file; the export
loads with ``from_pretrained`` and holds the weights the last checkpoint holds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeweave.cli.main import main
from readme_blocks import block_commands, shortened

TEXT = "".join(f"{i}: a pipeline trains the model no single device holds\n" for i in range(300))


def own_model_commands() -> list[list[str]]:
    return block_commands("Your model, your data, your weights back")


def _shortened(argv: list[str]) -> list[str]:
    out = shortened(argv, {"--steps": 200, "--checkpoint-every": 50})
    if out[0] == "train":
        out += ["--no-progress", "--batch-size", "4", "--seq-len", "16"]
    return out


@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_the_own_model_commands_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file

    from pipeweave.hf.presets import HFPreset, hf_model
    from pipeweave.runtime.checkpoint.store import resolve

    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    hf_model("llama", HFPreset(kv_heads=2, seq_len=16)).save_pretrained("my_model")
    Path("my_corpus.txt").write_text(TEXT, encoding="utf-8")
    commands = own_model_commands()
    assert [argv[0] for argv in commands] == ["train", "train", "export"]
    for argv in commands:
        assert main(_shortened(argv)) == 0, argv
    loaded = transformers.AutoModelForCausalLM.from_pretrained("my_model_trained",
                                                               dtype=torch.float32)
    last = resolve(Path("runs/more"))
    assert last.name.startswith("step-00000010")
    exported = {k: v for f in sorted(Path("my_model_trained").glob("*.safetensors"))
                for k, v in load_file(str(f)).items()}
    assert len(exported) == len(dict(loaded.named_parameters()))
    for name, value in exported.items():
        assert torch.equal(loaded.get_parameter(name), value), name
    start = transformers.AutoModelForCausalLM.from_pretrained("my_model", dtype=torch.float32)
    assert not torch.equal(start.model.embed_tokens.weight, loaded.model.embed_tokens.weight)
