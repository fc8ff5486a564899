"""Tensor parallelism inside a stage: a transformer's layers split over ``tp`` processes.

The ranks form a ``DeviceMesh`` of shape ``(pp, dp, tp)`` (:class:`RankMesh`). The schedule
has programs for the ``pp x dp`` pipeline ranks only; process ``p`` is pipeline rank
``p // tp``, tensor-parallel index ``p % tp``, and interprets that rank's program. Its pipeline
messages go to the process of the peer rank with the same tensor-parallel index
(:class:`~..communication.mesh.MeshTransport`): activations and gradients at stage boundaries
are whole (replicated over ``tp``), so each of the ``tp`` copies travels its own lane.

Inside a stage, ``torch.distributed.tensor.parallel.parallelize_module`` splits (Megatron):

* attention: ``qkv`` column-wise, by heads: q, k and v each split over the ranks
  (``_StridedShard(0, split_factor=3)``, so a rank holds its heads' q, k and v), ``proj``
  row-wise (the partial sums all-reduced);
* MLP: ``fc`` column-wise, ``proj`` row-wise;
* the Hugging Face Llama family (:mod:`pipeweave.hf`; Llama, Qwen2, Mistral): ``q_proj``,
  ``k_proj``, ``v_proj`` column-wise (by heads and key-value heads; HF's attention reads its
  head count from the tensor), ``o_proj`` row-wise; ``gate_proj``, ``up_proj`` column-wise,
  ``down_proj`` row-wise (as ``LlamaConfig.base_model_tp_plan``);
* everything else (embeddings, LayerNorms, the head) replicated: ``Replicate()`` DTensors
  computed whole on every rank, so that every parameter is a DTensor on the same mesh and
  the optimizer's ``foreach`` step (and FSDP2 over ``dp`` on the ``(dp, tp)`` mesh) takes them.

Sequence parallelism for the norms is not used: the residual stream would stay split over
the sequence between blocks and be gathered at every stage boundary (docs/sharding.md).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import (ColwiseParallel, ParallelStyle, RowwiseParallel,
                                               parallelize_module)
from torch.distributed.tensor.placement_types import _StridedShard

from ...models.gpt import AttentionBlock, Embedding, FFNBlock, Head, TransformerLayer
from ...models.tp_plan import split_linears

__all__ = ["RankMesh", "make_rank_mesh", "parallelize_stage", "check_parallelizable"]

def _known_blocks() -> tuple[type[nn.Module], ...]:
    """The blocks a split plan exists for: the built-in GPT's and ``pipeweave.hf``'s, the
    latter looked up when asked (the module the model was built from, even if
    ``pipeweave.hf`` was imported again since this module was)."""
    from ...hf import layers as hf_layers

    return (Embedding, AttentionBlock, FFNBlock, TransformerLayer, Head,
            hf_layers.TokenEmbedding, hf_layers.DecoderLayer, hf_layers.AttentionHalf,
            hf_layers.MLPHalf, hf_layers.Head)


@dataclass(frozen=True)
class RankMesh:
    """This process's place in the ``(pp, dp, tp)`` mesh."""

    mesh: DeviceMesh
    """The whole mesh, dimensions named ``pp``, ``dp``, ``tp``."""
    rank: int
    """The pipeline rank (``pp x dp``) whose program this process interprets."""
    tp_index: int
    """This process's coordinate along ``tp``."""

    @property
    def coordinates(self) -> tuple[int, int, int]:
        """This process's ``(pp, dp, tp)`` coordinates in :attr:`mesh`."""
        found = self.mesh.get_coordinate()
        assert found is not None, "every process is in the mesh"
        return found[0], found[1], found[2]

    @property
    def tp(self) -> int:
        return int(self.mesh.size(2))

    @property
    def tp_mesh(self) -> DeviceMesh:
        return self.mesh["tp"]

    @property
    def dp_mesh(self) -> DeviceMesh:
        return self.mesh["dp"]


def make_rank_mesh(*, depth: int, width: int, tp: int, process: int,
                   device_type: str) -> RankMesh:
    """The mesh of ``depth x width`` pipeline ranks with ``tp`` processes each; a collective
    (every process calls it once, at the same point). Pipeline rank ``k * depth + p`` (copy
    ``k``, position ``p``: :meth:`~pipeweave.ir.Layout.data_parallel`) is at ``(p, k)``."""
    ranks = torch.arange(depth * width * tp).reshape(width, depth, tp).transpose(0, 1)
    mesh = DeviceMesh(device_type, ranks.contiguous(), mesh_dim_names=("pp", "dp", "tp"))
    return RankMesh(mesh=mesh, rank=process // tp, tp_index=process % tp)


class _HeadsColwise(ColwiseParallel):
    """``qkv`` column-wise by heads: each of q, k, v split over the ranks, so a rank's output
    is its heads' ``[q_r | k_r | v_r]``."""

    def _partition_linear_fn(self, name: str, module: nn.Module, device_mesh: DeviceMesh) -> None:
        for key, param in module.named_parameters():
            split = distribute_tensor(param, device_mesh, [_StridedShard(0, split_factor=3)])
            module.register_parameter(key, nn.Parameter(split, requires_grad=param.requires_grad))

    @staticmethod
    def _prepare_output_fn(output_layouts: Any, use_local_output: bool, mod: nn.Module,
                           outputs: DTensor, device_mesh: DeviceMesh) -> Any:
        return outputs.to_local() if use_local_output else outputs  # keep the heads' split


class _Replicated(ParallelStyle):
    """A module computed whole on every rank, its parameters ``Replicate()`` DTensors."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def inputs(mod: nn.Module, args: Sequence[Any], mesh: DeviceMesh) -> tuple[Any, ...]:
            return tuple(DTensor.from_local(a, mesh, [Replicate()], run_check=False)
                         if isinstance(a, torch.Tensor) and not isinstance(a, DTensor) else a
                         for a in args)

        def outputs(mod: nn.Module, out: Any, mesh: DeviceMesh) -> Any:
            return out.to_local() if isinstance(out, DTensor) else out
        return distribute_module(module, device_mesh, None, inputs, outputs)  # type: ignore[arg-type]


_HF_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
_HF_MLP = ("gate_proj", "up_proj", "down_proj")


def _has(part: nn.Module, names: Sequence[str]) -> bool:
    return all(isinstance(getattr(part, n, None), nn.Linear) for n in names)


def _style(kind: str) -> ParallelStyle:
    """The torch style of one kind of :func:`~pipeweave.models.tp_plan.split_linears`."""
    return {"heads": _HeadsColwise, "column": ColwiseParallel, "row": RowwiseParallel}[kind]()


def _plan(block: nn.Module) -> dict[str, ParallelStyle]:
    """Every split linear of ``block``, by its path in the block (one description,
    :mod:`pipeweave.models.tp_plan`, that the profiler reads too)."""
    return {name: _style(kind) for name, kind in split_linears(block).items()}


def parallelize_stage(module: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Split ``module`` (a stage's ``nn.Sequential`` of GPT blocks) in place over ``tp_mesh``;
    every parameter becomes a DTensor on it (module docstring)."""
    # A replicated module's output is its DTensor's local tensor, a view; FSDP2 warns that an
    # in-place op on it would skip its hook. Nothing changes a block's output in place (the
    # runtime sends it or feeds it to the next block), so the warning is noise in every run.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(\w+\) returned a view",
                            category=UserWarning)
    for block in module.children():
        parallelize_module(block, tp_mesh, _plan(block))
        for part in block.modules():
            own = [p for p in part.parameters(recurse=False) if not isinstance(p, DTensor)]
            if own:
                _Replicated()._apply(part, tp_mesh)


def check_parallelizable(blocks: Sequence[nn.Module], tp: int) -> None:
    """Refuse, in one line naming the value and the fix, a model ``tp`` cannot split."""
    if any(hasattr(part, "c_attn") for block in blocks for part in block.modules()):
        raise ValueError(f"tp={tp} with the GPT-2 family: its fused Conv1D c_attn has no split "
                         f"plan yet; use hf-llama, hf-qwen2, hf-mistral or gpt-*, or tp=1")
    # by name: a test (or a user) may import pipeweave.hf again, giving the same classes anew
    known = {(cls.__module__, cls.__qualname__) for cls in _known_blocks()}
    for index, block in enumerate(blocks):
        if not any((cls.__module__, cls.__qualname__) in known for cls in type(block).__mro__):
            raise ValueError(f"tp={tp} with block {index} ({type(block).__name__}): only the "
                             f"built-in GPT (--model gpt-*) and the Hugging Face Llama family "
                             f"are tensor-parallel yet, not custom blocks; use tp=1")
        for part in block.modules():
            _check_part(part, tp)


def _check_part(part: nn.Module, tp: int) -> None:
    """Heads and widths ``tp`` divides, no dropout (its masks would differ per process)."""
    config = getattr(part, "config", None)
    counts: list[tuple[str, int]] = []
    if isinstance(part, AttentionBlock):
        counts.append((f"{part.n_heads} attention heads", part.n_heads))
    elif _has(part, _HF_ATTENTION) and config is not None:
        counts += [(f"{config.num_attention_heads} attention heads", config.num_attention_heads),
                   (f"{config.num_key_value_heads} key-value heads", config.num_key_value_heads)]
    elif isinstance(part, FFNBlock):
        counts.append((f"MLP width {part.fc.out_features}", part.fc.out_features))
    elif _has(part, _HF_MLP):
        width = int(getattr(part, "gate_proj").out_features)
        counts.append((f"MLP width {width}", width))
    for what, count in counts:
        if count % tp:
            raise ValueError(f"tp={tp} does not divide the {what}; give a tp that divides "
                             f"it")
    dropout = [float(getattr(part, key, 0.0) or 0.0)
               for key in ("p", "dropout", "attention_dropout")]
    if (isinstance(part, (nn.Dropout, AttentionBlock)) or _has(part, _HF_ATTENTION)) \
            and max(dropout) > 0:
        raise ValueError(f"tp={tp} with dropout {max(dropout)}: the split heads would draw "
                         f"other masks than the whole model; use dropout 0 or tp=1")
