"""FSDP2 inside a stage: its blocks sharded over the stage's data-parallel ranks (``Plan.shard``).

With ``width = D`` a stage runs on ``D`` ranks (one per pipeline copy). Unsharded, each holds
the whole stage and the schedule's ``AR`` sums the gradients before the update. Sharded, every
block and then the stage's ``nn.Sequential`` are wrapped with
``torch.distributed.fsdp.fully_shard`` over a ``DeviceMesh`` of the stage's process group:
each rank keeps ``1/D`` of every parameter, gradient and optimizer state, and gathers the
parameters a forward or backward needs (``full``: again for the backward, ZeRO-3; ``grad-op``:
kept from the forward to the backward, ZeRO-2).

Gradients are reduce-scattered **once per update**: before each backward the stage tells
FSDP whether it is the stage's last backward before the next ``U`` in this rank's program
(:func:`last_backwards`, read from the schedule, which is data); the earlier ones accumulate
the unsharded gradient locally (``set_requires_gradient_sync(False)``). The reduction sums, as
the ``AR`` it replaces does (divide factor 1, sum on the wire), so the update is the
unsharded run's; the ``AR`` then has nothing left to do.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import cast

import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from ...ir import Action, Op
from .two_step import TwoStep, two_step_layouts

__all__ = ["StageSharding", "shard_stage", "last_backwards"]


@dataclass(frozen=True)
class StageSharding:
    """A sharded stage's FSDP root and the backwards that reduce-scatter."""

    root: FSDPModule
    last: frozenset[tuple[int, int]]
    """``(micro-batch, pipeline)`` of every backward that is the stage's last before an update."""
    layouts: Mapping[int, TwoStep] = field(default_factory=dict)
    """With tensor parallelism: ``id(parameter) ->`` its two-step layout (:mod:`.two_step`),
    how a checkpoint gathers and cuts its tensors; empty without."""

    @contextmanager
    def gathered(self) -> Iterator[None]:
        """The stage's parameters whole over ``dp`` inside (FSDP2's unsharded ones: plain
        tensors, or the tensor-parallel DTensors with their own layout, which the sharded
        2-D spec of a head-split ``qkv`` does not describe), sharded again after."""
        stage = cast(nn.Module, self.root)  # fully_shard keeps the module, adding FSDPModule
        parts = [m for m in stage.modules() if isinstance(m, FSDPModule)]  # every block
        for part in parts:
            part.unshard()
        try:
            yield
        finally:
            for part in parts:
                part.reshard()

    def before_backward(self, microbatch: int, pipeline: int) -> None:
        """Reduce-scatter at this backward only if it is the update's last."""
        self.root.set_requires_gradient_sync((microbatch, pipeline) in self.last)


def last_backwards(program: Sequence[Action], stage: int) -> frozenset[tuple[int, int]]:
    """The backwards of ``stage`` in ``program`` that are its last before each of its updates."""
    found: set[tuple[int, int]] = set()
    last: tuple[int, int] | None = None
    for action in program:
        if action.stage != stage:
            continue
        if action.op is Op.BACKWARD:
            assert action.microbatch is not None
            last = (action.microbatch, action.pipeline)
        elif action.op is Op.STEP and last is not None:
            found.add(last)
            last = None
    return frozenset(found)


def shard_stage(module: nn.Module, group: dist.ProcessGroup, mode: str, *, device_type: str,
                program: Sequence[Action], stage: int,
                mesh: DeviceMesh | None = None) -> StageSharding:
    """Wrap ``module`` (a stage's blocks, an ``nn.Sequential``) in place with FSDP2 over
    ``group``: each block with parameters, then the stage (module docstring); ``mode`` is
    ``full`` or ``grad-op``. ``mesh``: the ``dp`` dimension of the ``(pp, dp, tp)`` mesh
    when the stage is also tensor-parallel (FSDP2 then shards the split parameters over
    ``dp``, a 2-D ``(dp, tp)`` layout, as torchtitan does); None: a mesh of ``group``."""
    if mode not in ("full", "grad-op"):
        raise ValueError(f"shard mode {mode!r}: give full or grad-op (none is not sharded)")
    if device_type == "cuda" and dist.get_backend(group) != "nccl":
        raise ValueError(f"--shard {mode} on CUDA needs NCCL, but ranks share GPUs over "
                         f"{dist.get_backend(group)}; give every rank its own GPU, or --shard none")
    split = mesh is not None  # the stage is tensor-parallel: 2-D (dp, tp) parameters
    if mesh is None:
        mesh = DeviceMesh.from_group(group, device_type=device_type)
    reshard = mode == "full"
    for block in module.children():
        if any(True for _ in block.parameters()):
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
    root = fully_shard(module, mesh=mesh, reshard_after_forward=reshard)
    for part in module.modules():
        if isinstance(part, FSDPModule):
            part.set_gradient_divide_factor(1.0)  # a sum, as the all-reduce it replaces
            part.set_force_sum_reduction_for_comms(True)  # gloo has no pre-multiplied sum
    layouts = two_step_layouts(module, mesh) if split else {}
    return StageSharding(root=root, last=last_backwards(program, stage), layouts=layouts)
