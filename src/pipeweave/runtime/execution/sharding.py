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

A split backward (``I`` then ``W``, :mod:`pipeweave.split_backward`) runs partly outside
FSDP2's autograd hooks: ``I`` is an ordinary backward to the stage input and the blocks'
recorded outputs, so FSDP2 gathers the parameters before it (pre-backward hook) and lets them
go after (post-backward hook, with ``full``; ``grad-op`` keeps them for the ``W``), reducing
nothing (``set_requires_gradient_sync(False)``). ``W`` starts from the recorded outputs
inside the blocks and reaches only the parameters, so no FSDP2 hook fires: the stage gathers
the blocks itself, one at a time (``unshard``: the weight-gradient kernels may read the
weights), the gradients accumulate on the gathered parameters the forward's graph holds
(:func:`pipeweave.split_backward.recording` reads them as each module's call starts), and at the
stage's last ``W`` before a ``U`` it runs FSDP2's post-backward itself (reduce-scatter,
reshard, then the root's final callback), as ``torch.distributed.pipelining`` does for its
zero-bubble schedules.

Each action's first gather can start one action early, in the order of the rank's program
(:meth:`StageSharding.prefetch`, driven by :mod:`.gathers`); FSDP2's hooks then wait for it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, cast

import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from ...ir import Action, Op
from ...split_backward import PendingWeights, weight_gradient
from .two_step import TwoStep, two_step_layouts

__all__ = ["StageSharding", "shard_stage", "last_backwards"]


@dataclass(frozen=True)
class StageSharding:
    """A sharded stage's FSDP root and the backwards that reduce-scatter."""

    root: FSDPModule
    last: frozenset[tuple[int, int]]
    """``(micro-batch, pipeline)`` of every backward (``B``, or ``W`` of a split one) that is
    the stage's last before an update."""
    layouts: Mapping[int, TwoStep] = field(default_factory=dict)
    """With tensor parallelism: ``id(parameter) ->`` its two-step layout (:mod:`.two_step`),
    how a checkpoint gathers and cuts its tensors; empty without."""
    mode: str = "full"
    """``full`` or ``grad-op`` (:func:`shard_stage`)."""

    def _parts(self) -> list[FSDPModule]:
        stage = cast(nn.Module, self.root)  # fully_shard keeps the module, adding FSDPModule
        return [m for m in stage.modules() if isinstance(m, FSDPModule)]  # every block

    def prefetch(self, end: str) -> None:
        """Start the gather (``unshard(async_op=True)``) of the ``first`` or ``last`` block
        with parameters, the one an action begins with (:mod:`.gathers`): nothing to do if it
        is gathered already (``grad-op`` after a forward) or being gathered; the block's own
        FSDP2 hook, or ``W``'s ``unshard``, waits for it."""
        if end not in ("first", "last"):
            raise ValueError(f"prefetch end {end!r}: give first or last")
        blocks = [m for m in cast(nn.Module, self.root).children() if isinstance(m, FSDPModule)]
        if blocks:
            (blocks[0] if end == "first" else blocks[-1]).unshard(async_op=True)

    @contextmanager
    def gathered(self) -> Iterator[None]:
        """The stage's parameters whole over ``dp`` inside (FSDP2's unsharded ones: plain
        tensors, or the tensor-parallel DTensors with their own layout, which the sharded
        2-D spec of a head-split ``qkv`` does not describe), sharded again after."""
        parts = self._parts()
        for part in parts:
            part.unshard()
        try:
            yield
        finally:
            for part in parts:
                part.reshard()

    def before_backward(self, microbatch: int, pipeline: int) -> None:
        """``B``: reduce-scatter at this backward only if it is the update's last."""
        self.root.set_reshard_after_backward(True)
        self.root.set_requires_gradient_sync((microbatch, pipeline) in self.last)

    def before_input_gradient(self) -> None:
        """``I``: reduce nothing (its ``W`` has not run); ``grad-op`` keeps the gathered
        parameters for the ``W`` (ZeRO-2: whole from the forward to the backward)."""
        self.root.set_reshard_after_backward(self.mode == "full")
        self.root.set_requires_gradient_sync(False)

    def weight_gradient(self, microbatch: int, pipeline: int,
                        pending: Sequence[PendingWeights]) -> None:
        """``W`` of ``pending`` (a micro-batch's pieces) block by block, each gathered only
        while its weight gradients are computed (ZeRO-3's one block at a time); what falls
        back to the stage output with the whole stage gathered. No reduction during it;
        after it, the reduce-scatter if it is the update's last backward."""
        self.root.set_requires_gradient_sync(False)
        for part in reversed(self._parts()):  # the blocks, then the root's own parameters
            part.unshard()  # a no-op where the I left them gathered (grad-op)
            within = {id(p) for p in cast(nn.Module, part).parameters()}  # the gathered ones
            for each in pending:
                weight_gradient(each, within)
            part.reshard()
        if any(each.parts or not each.complete for each in pending):
            with self.gathered():
                for each in pending:
                    weight_gradient(each)
        if (microbatch, pipeline) in self.last:
            _post_backward(self.root)


def _post_backward(root: FSDPModule) -> None:
    """FSDP2's post-backward for every block of ``root``, run by hand: the gathered gradients
    reduce-scattered into the shards, then the root's final callback (waits for the
    reductions, resets FSDP2's backward state). Its hooks do this after a backward that
    crosses the blocks' inputs; ``W`` never does. Private FSDP2 state, read as
    ``torch.distributed.pipelining`` reads it (its ``perform_reduce_grad``)."""
    root.set_reshard_after_backward(True)
    root.set_requires_gradient_sync(True)
    state: Any = fully_shard.state(cast(nn.Module, root))  # type: ignore[attr-defined]
    for part in state._state_ctx.all_states:
        for group in part._fsdp_param_groups:
            group.post_backward()
    state._root_post_backward_final_callback()


def last_backwards(program: Sequence[Action], stage: int) -> frozenset[tuple[int, int]]:
    """The backwards of ``stage`` in ``program`` that are its last before each of its updates:
    ``B``, or the ``W`` of a split one (its ``I`` computes no weight gradient)."""
    found: set[tuple[int, int]] = set()
    last: tuple[int, int] | None = None
    for action in program:
        if action.stage != stage:
            continue
        if action.op in (Op.BACKWARD, Op.BACKWARD_WEIGHT):
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
    split = mesh is not None  # the stage is tensor-parallel: 2-D (dp, tp) parameters
    if mesh is None:
        mesh = DeviceMesh.from_group(group, device_type=device_type)
    reshard = mode == "full"
    for block in module.children():
        if any(True for _ in block.parameters()):
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
    root = fully_shard(module, mesh=mesh, reshard_after_forward=reshard)
    host = device_type == "cpu" and dist.get_backend(mesh.get_group()) == "gloo"
    if host:  # FSDP2's private collective API, needed on gloo only (not on a CUDA run)
        from ..communication.host_collectives import HostAllGather, HostReduceScatter
    for part in module.modules():
        if isinstance(part, FSDPModule):
            part.set_gradient_divide_factor(1.0)  # a sum, as the all-reduce it replaces
            part.set_force_sum_reduction_for_comms(True)  # gloo has no pre-multiplied sum
            if host:  # its buffers freed where the profiler counts them (.host_collectives)
                part.set_custom_reduce_scatter(HostReduceScatter())
                part.set_custom_all_gather(HostAllGather())
    layouts = two_step_layouts(module, mesh) if split else {}
    return StageSharding(root=root, last=last_backwards(program, stage), layouts=layouts,
                         mode=mode)
