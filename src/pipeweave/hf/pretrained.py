"""Pretrained weights from a local transformers folder, read per stage (``--hf-pretrained``).

The folder is what ``save_pretrained`` writes: ``config.json`` and ``model.safetensors``, or
shards listed by ``model.safetensors.index.json``. The model is built on the meta device
(:mod:`pipeweave.models.materialize`); each rank, making its stage's blocks real, fills every
module's tensors from the checkpoint with safetensors' lazy reads (``safe_open``): only the
tensors of its own blocks are read, straight onto its device. A module the checkpoint does not
cover (the rotary frequencies, a non-persistent buffer; an LM head tied to the embedding, which
``save_pretrained`` stores once) keeps the model's own initialisation, and a tied head takes
the embedding's loaded value, as ``from_pretrained`` ties it.

    spec = build_model("hf-llama", pretrained="path/to/folder", meta=True)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..files import read_json

__all__ = ["CheckpointTensors", "PretrainedInit", "check_pretrained"]

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


def check_pretrained(folder: str | Path) -> Path:
    """``folder``'s ``config.json``, after checking the folder holds a model pipeweave can
    read (ValueError naming the folder and the fix otherwise)."""
    path = Path(folder)
    if not path.is_dir():
        raise ValueError(f"--hf-pretrained {path}: not a folder; give a folder written by "
                         f"save_pretrained (config.json and model.safetensors)")
    if not (path / "config.json").is_file():
        raise ValueError(f"--hf-pretrained {path}: no config.json in it; give a folder "
                         f"written by save_pretrained")
    if not (path / SINGLE).is_file() and not (path / INDEX).is_file():
        raise ValueError(f"--hf-pretrained {path}: neither {SINGLE} nor {INDEX} in it; save "
                         f"the model with save_pretrained(..., safe_serialization=True)")
    return path / "config.json"


class CheckpointTensors:
    """The tensors of a safetensors checkpoint by name, read lazily, each file opened once."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._open: dict[str, Any] = {}
        self.files = self._files()
        self.read: list[str] = []
        """Every name read so far (what a rank loaded)."""

    def _files(self) -> dict[str, str]:
        """Tensor name -> the file holding it."""
        if (self.folder / INDEX).is_file():
            index = read_json(self.folder / INDEX, what=f"--hf-pretrained {self.folder / INDEX}",
                              fix="write it again with save_pretrained")
            weight_map = index.get("weight_map") if isinstance(index, dict) else None
            if not isinstance(weight_map, dict):
                raise ValueError(f"--hf-pretrained {self.folder / INDEX} has no weight_map; "
                                 f"write it again with save_pretrained")
            return {str(name): str(file) for name, file in weight_map.items()}
        return {name: SINGLE for name in self._handle(SINGLE).keys()}

    def _handle(self, file: str) -> Any:
        if file not in self._open:
            from safetensors import safe_open

            self._open[file] = safe_open(str(self.folder / file), framework="pt")
        return self._open[file]

    def __contains__(self, name: str) -> bool:
        return name in self.files

    def shape(self, name: str) -> tuple[int, ...]:
        """The shape of tensor ``name``, from its file's header (nothing read)."""
        return tuple(self._handle(self.files[name]).get_slice(name).get_shape())

    def get(self, name: str, device: torch.device) -> Tensor:
        """The tensor ``name``, read from its file only now."""
        self.read.append(name)
        tensor: Tensor = self._handle(self.files[name]).get_tensor(name)
        return tensor.to(device)


class PretrainedInit:
    """A block initialiser (:data:`pipeweave.models.materialize.Init`) that fills each module
    from the checkpoint, the model's own ``_init_weights`` where the checkpoint has nothing.

    ``model``: the transformers model the blocks wrap (on the meta device), whose module names
    are the checkpoint's keys; ``blocks`` and ``names``: the spec's blocks and block names.
    """

    def __init__(self, model: Any, blocks: tuple[nn.Module, ...], names: tuple[str, ...],
                 folder: str | Path) -> None:
        self.model = model
        self.tensors = CheckpointTensors(folder)
        hf_names = {id(module): name for name, module in model.named_modules()}
        self.prefixes: dict[str, str] = {}
        """A module's global name in the blocks (``"<block>.<path>"``) -> its name in HF's."""
        for block, block_name in zip(blocks, names):
            for path, module in block.named_modules():
                if id(module) in hf_names:
                    self.prefixes[f"{block_name}.{path}" if path else block_name] = \
                        hf_names[id(module)]
        own = {f"{hf_names[id(m)]}.{n}".lstrip(".") for m in model.modules()
               if id(m) in hf_names for n, _ in m.named_parameters(recurse=False)}
        tied = {name for name, _ in model.named_parameters(remove_duplicate=False)} - \
            {name for name, _ in model.named_parameters()}
        missing = sorted(own - tied - set(self.tensors.files))
        if missing:
            raise ValueError(f"--hf-pretrained {folder}: the checkpoint lacks {len(missing)} of "
                             f"the model's parameters (e.g. {missing[0]}); give the folder of "
                             f"a model saved with this config.json")
        for key, parameter in model.named_parameters():
            if key in self.tensors and self.tensors.shape(key) != tuple(parameter.shape):
                raise ValueError(f"--hf-pretrained {folder}: {key} has shape "
                                 f"{self.tensors.shape(key)}, the model {tuple(parameter.shape)}; "
                                 f"give the config.json the weights were saved with")

    def __call__(self, module: nn.Module, name: str) -> None:
        prefix = self.prefixes.get(name)
        own = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
        keys = {local: f"{prefix}.{local}" if prefix else local for local, _ in own}
        if prefix is None or any(keys[local] not in self.tensors for local, _ in own):
            self.model._init_weights(module)  # what the checkpoint does not hold
        if prefix is None:
            return
        for local, tensor in own:
            if keys[local] in self.tensors:
                tensor.copy_(self.tensors.get(keys[local], tensor.device))
