"""Whole and local values of tensors that may be sharded (FSDP2's ``DTensor`` parameters).

A stage sharded over its data-parallel ranks (``Plan.shard``) holds each parameter, gradient
and optimizer state as a ``DTensor``: :func:`local_value` is the part this rank stores (what
its memory holds), :func:`full_value` the whole tensor, gathered from the stage's ranks. The
gather is a collective: every rank of the stage calls it for the same tensors in the same
order. Plain tensors come back as they are. :func:`laid_out_like` goes the other way: a whole
tensor (a checkpoint's) as this rank's part of a sharded one, with no communication.
"""

from __future__ import annotations

from torch import Tensor
from torch.distributed.tensor import DTensor, distribute_tensor

__all__ = ["full_value", "local_value", "stored_part", "with_local", "is_sharded",
           "laid_out_like"]


def is_sharded(tensor: Tensor) -> bool:
    return isinstance(tensor, DTensor)


def full_value(tensor: Tensor) -> Tensor:
    """The whole tensor (a collective over the stage's ranks when sharded)."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def local_value(tensor: Tensor) -> Tensor:
    """The part of ``tensor`` this rank stores."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def stored_part(tensor: Tensor) -> Tensor:
    """The part of ``tensor`` this rank stores, without recording an autograd step (for a
    saved-tensor hook, where ``to_local()`` would add one)."""
    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


def with_local(like: Tensor, local: Tensor) -> Tensor:
    """``local`` as this rank's part of a tensor laid out as ``like`` (a DTensor with
    ``like``'s mesh, placements and shape; ``local`` itself when ``like`` is plain)."""
    if not isinstance(like, DTensor):
        return local
    return DTensor.from_local(local, like.device_mesh, like.placements, run_check=False,
                              shape=like.shape, stride=like.stride())


def laid_out_like(like: Tensor, whole: Tensor) -> Tensor:
    """``whole`` laid out as ``like``: a DTensor with ``like``'s mesh and placements whose local
    part is this rank's piece of ``whole`` (cut here, with no collective: every rank holds
    ``whole``); ``whole`` itself when ``like`` is plain. The inverse of :func:`full_value`."""
    if not isinstance(like, DTensor):
        return whole
    return distribute_tensor(whole.to(like.device), like.device_mesh, like.placements,
                             src_data_rank=None)
