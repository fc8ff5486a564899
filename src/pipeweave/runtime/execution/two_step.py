"""Whole tensors of a stage both split over ``tp`` and sharded over ``dp``, and back.

FSDP2 over a tensor-parallel stage (``--shard full|grad-op`` with ``tp > 1``) cuts each
process's tensor-parallel part on dim 0 into ``dp`` pieces. Its 2-D ``(dp, tp)`` spec does
not describe that layout for the head-split ``qkv`` (whose ``tp`` placement is
``_StridedShard(0, split_factor=3)``, :mod:`.tensor_parallel`), so ``full_tensor()`` of such a
parameter's optimizer state would come back permuted. :func:`two_step_whole` gathers in two
steps instead — over ``dp`` to the tensor-parallel part, then over ``tp`` with the parameter's
own ``tp`` placements, which FSDP2 keeps per parameter — and :func:`two_step_part` cuts a
whole tensor back in the same two steps, with no communication (the checkpoints of
docs/sharding.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from torch.distributed.tensor._dtensor_spec import DTensorSpec
from torch.distributed.tensor.placement_types import _StridedShard

__all__ = ["TwoStep", "two_step_layouts", "two_step_whole", "two_step_part"]


@dataclass(frozen=True)
class TwoStep:
    """How a parameter of a ``(dp, tp)`` stage is laid out: its ``tp`` spec, then ``dp``."""

    dp: DeviceMesh
    """The ``dp`` mesh FSDP2 shards the tensor-parallel part over (on dim 0)."""
    tp: DTensorSpec
    """The parameter's tensor-parallel layout (mesh, placements, whole shape and stride)."""

    @property
    def tp_shape(self) -> tuple[int, ...]:
        """The shape of a process's tensor-parallel part (the splits are even)."""
        shape = list(self.tp.shape)
        for dim, placement in enumerate(self.tp.placements):
            if isinstance(placement, (Shard, _StridedShard)):  # the latter no Shard in torch 2.13
                shape[placement.dim] //= self.tp.mesh.size(dim)
        return tuple(shape)


def two_step_layouts(module: nn.Module, dp: DeviceMesh) -> Mapping[int, TwoStep]:
    """``id(parameter) -> TwoStep`` for every sharded tensor-parallel parameter of ``module``
    (FSDP2 keeps the ``tp`` spec per parameter, ``FSDPParam._unsharded_dtensor_spec``)."""
    found: dict[int, TwoStep] = {}
    for part in module.modules():
        if not isinstance(part, FSDPModule):
            continue
        group = part._get_fsdp_state()._fsdp_param_group
        for param in group.fsdp_params if group is not None else ():
            spec = getattr(param, "_unsharded_dtensor_spec", None)
            if spec is not None:
                found[id(param.sharded_param)] = TwoStep(dp, spec)
    return found


def two_step_whole(tensor: Tensor, layout: TwoStep) -> Tensor:
    """The whole tensor of ``tensor`` (laid out as its parameter): a collective of the
    stage's ``dp`` ranks and then its ``tp`` processes."""
    assert isinstance(tensor, DTensor)
    part = DTensor.from_local(tensor.to_local(), layout.dp, [Shard(0)], run_check=False,
                              shape=torch.Size(layout.tp_shape),
                              stride=_contiguous(layout.tp_shape)).full_tensor()
    return DTensor.from_local(part, layout.tp.mesh, layout.tp.placements, run_check=False,
                              shape=layout.tp.shape, stride=layout.tp.stride).full_tensor()


def two_step_part(like: Tensor, whole: Tensor, layout: TwoStep) -> Tensor:
    """``whole`` laid out as ``like`` (this rank's piece, a DTensor with ``like``'s spec)."""
    assert isinstance(like, DTensor)
    part = distribute_tensor(whole.to(like.device), layout.tp.mesh, layout.tp.placements,
                             src_data_rank=None).to_local()
    piece = distribute_tensor(part, layout.dp, [Shard(0)], src_data_rank=None).to_local()
    return DTensor.from_local(piece, like.device_mesh, like.placements, run_check=False,
                              shape=like.shape, stride=like.stride())


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))
