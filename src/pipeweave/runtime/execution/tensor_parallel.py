"""Tensor parallelism inside a stage: the built-in GPT's layers split over ``tp`` processes.

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
* everything else (embeddings, LayerNorms, the head) replicated: ``Replicate()`` DTensors
  computed whole on every rank, so that every parameter is a DTensor on the same mesh and
  the optimizer's ``foreach`` step (and FSDP2 over ``dp`` on the ``(dp, tp)`` mesh) takes them.

Sequence parallelism for the norms is not used: the residual stream would stay split over
the sequence between blocks and be gathered at every stage boundary (docs/sharding.md).
"""

from __future__ import annotations

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

__all__ = ["RankMesh", "make_rank_mesh", "parallelize_stage", "check_parallelizable"]

_GPT_BLOCKS = (Embedding, AttentionBlock, FFNBlock, TransformerLayer, Head)


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


def _plan(block: nn.Module) -> dict[str, ParallelStyle]:
    """The split of one GPT block's linears (module docstring)."""
    attention = {"qkv": _HeadsColwise(), "proj": RowwiseParallel()}
    mlp = {"fc": ColwiseParallel(), "proj": RowwiseParallel()}
    if isinstance(block, AttentionBlock):
        return dict(attention)
    if isinstance(block, FFNBlock):
        return dict(mlp)
    if isinstance(block, TransformerLayer):
        return {**{f"attn.{k}": v for k, v in attention.items()},
                **{f"ffn.{k}": v for k, v in mlp.items()}}
    return {}


def parallelize_stage(module: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Split ``module`` (a stage's ``nn.Sequential`` of GPT blocks) in place over ``tp_mesh``;
    every parameter becomes a DTensor on it (module docstring)."""
    for block in module.children():
        parallelize_module(block, tp_mesh, _plan(block))
        for part in block.modules():
            own = [p for p in part.parameters(recurse=False) if not isinstance(p, DTensor)]
            if own:
                _Replicated()._apply(part, tp_mesh)


def check_parallelizable(blocks: Sequence[nn.Module], tp: int) -> None:
    """Refuse, in one line naming the value and the fix, a model ``tp`` cannot split."""
    for index, block in enumerate(blocks):
        if not isinstance(block, _GPT_BLOCKS):
            raise ValueError(f"tp={tp} with block {index} ({type(block).__name__}): only the "
                             f"built-in GPT (--model gpt-*) is tensor-parallel yet (not the "
                             f"Hugging Face models nor custom blocks); use tp=1")
        for part in block.modules():
            if isinstance(part, AttentionBlock):
                _check_attention(part, tp)
            elif isinstance(part, FFNBlock) and part.fc.out_features % tp:
                raise ValueError(f"tp={tp} does not divide the MLP width "
                                 f"{part.fc.out_features}; give a tp that divides it")
            elif isinstance(part, nn.Dropout) and part.p > 0:
                raise ValueError(f"tp={tp} with dropout {part.p}: the split heads would draw "
                                 f"other masks than the whole model; use dropout 0 or tp=1")


def _check_attention(block: AttentionBlock, tp: int) -> None:
    if block.n_heads % tp:
        raise ValueError(f"tp={tp} does not divide the {block.n_heads} attention heads; give "
                         f"a tp that divides the number of heads")
    if block.dropout > 0:
        raise ValueError(f"tp={tp} with attention dropout {block.dropout}: the split heads "
                         f"would draw other masks than the whole model; use dropout 0 or tp=1")
