"""A checkpoint's trained weights as a folder other tools load (``pipeweave export``).

The output is safetensors shards and the index ``save_pretrained`` writes for large models::

    OUT/
      model-00001-of-00002.safetensors   the weights of checkpoint shard rank0.pt
      model-00002-of-00002.safetensors   ... of rank1.pt
      model.safetensors.index.json       {"metadata": {"total_size": ...}, "weight_map": {...}}
      config.json                        HF models: the transformers config
      pipeweave_export.json              the model, the step and the source checkpoint

* **HF models** (``hf-*``): the tensors carry transformers' names (``transformer.h.0.attn...``)
  and ``config.json`` is the model's, so ``AutoModelForCausalLM.from_pretrained(OUT)`` loads
  it; an LM head tied to the embedding is stored once, as ``save_pretrained`` stores it.
* **Built-in models**: the tensors carry the global names (``"<block>.<name>"``) of
  ``nn.Sequential(*build_model(name).blocks)``: :func:`load_exported` returns that state dict.

Nothing gathers the whole model: each checkpoint shard (one rank's stages) is read, renamed and
written as one output file before the next is read — the peak is the largest stage, as in the
run that wrote the checkpoint. Every file is written under a temporary name and renamed, and
the index last: a folder with an index is whole.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .store import CheckpointError, StoredCheckpoint, resolve

__all__ = ["ExportResult", "export_checkpoint", "load_exported", "model_record", "INDEX",
           "RECORD"]

INDEX = "model.safetensors.index.json"
RECORD = "pipeweave_export.json"


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_checkpoint` wrote."""

    folder: Path
    step: int
    files: tuple[str, ...]
    tensors: int
    bytes: int
    largest_file_bytes: int
    """The most bytes of tensors held at once: one checkpoint shard's."""
    hf: bool


def model_record(model: Any) -> dict[str, Any] | None:
    """The JSON record of a :class:`~pipeweave.runtime.job.BuiltinModel` a checkpoint keeps so
    that ``export`` can rebuild its names; None for a user's own model factory."""
    from ..job import BuiltinModel

    if not isinstance(model, BuiltinModel):
        return None
    record = {"name": model.name, "seed": model.seed, "dtype": model.dtype,
              "overrides": {k: str(v) if isinstance(v, Path) else v
                            for k, v in model.overrides.items()}}
    try:
        json.dumps(record)
    except (TypeError, ValueError):
        return None  # an override JSON cannot hold: export then needs --model
    return record


def _builtin_model(record: Mapping[str, Any]) -> Any:
    from ..job import BuiltinModel

    return BuiltinModel(str(record["name"]), seed=int(record.get("seed", 0)),
                        dtype=str(record.get("dtype", "float32")),
                        overrides=dict(record.get("overrides", {})))


def _renaming(model: Any, stored: StoredCheckpoint) -> tuple[dict[str, str], Any]:
    """Global name -> exported name, and the transformers config (None: built-in model).
    Checks that the checkpoint holds exactly this model's parameters."""
    from .resume import model_parameters

    spec = model()
    expected = model_parameters(spec, "full")
    saved = stored.manifest["parameters"]
    if set(expected) != set(saved) or any(saved[n]["shape"] != expected[n][0] for n in expected):
        differ = sorted(set(expected) ^ set(saved)) or \
            [n for n in expected if saved[n]["shape"] != expected[n][0]]
        raise CheckpointError(f"checkpoint {stored.folder} does not hold the parameters of model "
                              f"{model.name} (first difference: {differ[0]}); give the --model "
                              f"(and --hf-config/--hf-pretrained, --seq-len) it was trained with")
    if not model.name.startswith("hf-"):
        return {name: name for name in saved}, None
    from ...hf.presets import exported_names

    names, config = exported_names(model.name, **model.overrides)
    return {name: names[name] for name in saved}, config


def _write_atomic(path: Path, write: Any) -> None:
    temporary = path.with_name(path.name + ".partial")
    write(temporary)
    with open(temporary, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def _shard_tensors(stored: StoredCheckpoint, file: str, pipeline: int | None) -> dict[str, Tensor]:
    """One checkpoint shard's parameters: pipeline ``pipeline`` of an AvgPipe run, or its
    reference model (None; the only model of any other run)."""
    data = stored.load(file)
    if pipeline is None:
        if "reference" in data:
            return dict(data["reference"])
        return dict(data["parameters"])
    if pipeline == 0:
        return dict(data["parameters"])
    pipelines = data.get("pipelines", {})
    if str(pipeline) not in pipelines:
        raise CheckpointError(f"--pipeline {pipeline}: checkpoint {stored.folder} holds "
                              f"{1 + len(pipelines)} pipeline(s) (0..{len(pipelines)}); give "
                              f"one of them, or leave --pipeline out for the reference model")
    return dict(pipelines[str(pipeline)]["parameters"])


def export_checkpoint(checkpoint: str | Path, out: str | Path, *, model: Any = None,
                      pipeline: int | None = None) -> ExportResult:
    """Write the weights of ``checkpoint`` (a checkpoint folder, a checkpoint directory or a
    run's output folder: its newest complete checkpoint) to the new folder ``out``.

    ``model``: the :class:`~pipeweave.runtime.job.BuiltinModel` the run trained; by default
    the one the checkpoint records. ``pipeline`` (AvgPipe): which parallel model to export;
    by default the reference model (the average of the parallel ones, AvgPipe §3.2).
    """
    stored = StoredCheckpoint(resolve(checkpoint), verify=True, suggest=False)
    recorded = stored.manifest.get("model")
    if model is None:
        if recorded is None:
            raise CheckpointError(f"checkpoint {stored.folder} does not record its model (written "
                                  f"by a user's own model factory or an older pipeweave); give "
                                  f"--model NAME (and --hf-config/--hf-pretrained) it was "
                                  f"trained with")
        model = _builtin_model(recorded)
    renaming, config = _renaming(model, stored)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"--out {out} exists and is not empty; give a new folder (export never "
                         f"overwrites)")
    out.mkdir(parents=True, exist_ok=True)
    try:
        return _write_all(stored, out, renaming, config, model, pipeline)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)  # nothing half-written is left behind
        raise


def _write_all(stored: StoredCheckpoint, out: Path, renaming: Mapping[str, str], config: Any,
               model: Any, pipeline: int | None) -> ExportResult:
    from safetensors.torch import save_file

    files = sorted((f for f in stored.shards if stored.shards[f].get("blocks")),
                   key=lambda f: min(stored.shards[f]["blocks"]))
    names = [f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i in range(len(files))]
    weight_map: dict[str, str] = {}
    total = largest = 0
    for file, name in zip(files, names):
        tensors = {renaming[k]: v.contiguous() for k, v in _shard_tensors(stored, file,
                                                                           pipeline).items()}
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        total, largest = total + size, max(largest, size)
        _write_atomic(out / name, lambda path, t=tensors: save_file(t, str(path),
                                                                     metadata={"format": "pt"}))
        weight_map.update({k: name for k in tensors})
        del tensors
    if config is not None:
        config.save_pretrained(str(out))
    record = {"format": "pipeweave-export", "version": 1, "model": model_record(model),
              "step": stored.step, "checkpoint": str(stored.folder.resolve()),
              "pipeline": pipeline, "hf": config is not None}
    (out / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    _write_atomic(out / INDEX, lambda path: path.write_text(json.dumps(index, indent=2) + "\n"))
    return ExportResult(out, stored.step, tuple(names), len(weight_map), total, largest,
                        config is not None)


def load_exported(folder: str | Path, *, device: str | torch.device = "cpu") -> dict[str, Tensor]:
    """The state dict an export holds (every shard of its index), e.g. to load into
    ``nn.Sequential(*build_model(name).blocks)`` (built-in models) or an HF model."""
    from safetensors.torch import load_file

    folder = Path(folder)
    index_path = folder / INDEX
    if not index_path.is_file():
        raise ValueError(f"{folder} is not a complete export (no {INDEX}); export it again with "
                         f"`pipeweave export --checkpoint DIR --out {folder}`")
    index = json.loads(index_path.read_text())
    state: dict[str, Tensor] = {}
    for file in sorted(set(index["weight_map"].values())):
        state.update(load_file(str(folder / file), device=str(device)))
    return state


def describe(result: ExportResult) -> dict[str, Any]:
    """The result as JSON-ready data."""
    data = asdict(result)
    data["folder"] = str(result.folder)
    return data
