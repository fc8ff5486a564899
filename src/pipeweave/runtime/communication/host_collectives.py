"""FSDP2's reduce-scatter and all-gather on a host (gloo) group, their buffers let go on the
rank's own thread (:class:`.let_go.LetGo`: gloo's thread would otherwise free some of them
where torch's profiler does not see it, and ``Job.track_allocations`` counted them alive).

gloo's own reduce-scatter (``reduce_scatter_tensor``) all-reduces a copy of the
input on its thread and copies this rank's chunk out; this one all-reduces FSDP2's input
buffer itself (FSDP2 reads it no more), so the sum and the wire are the same, bit for bit, and
the copy (one block's gradient) is not made at all.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from .let_go import LetGo

__all__ = ["HostReduceScatter", "HostAllGather"]


class HostReduceScatter(ReduceScatter):
    """FSDP2's reduce-scatter on a host (gloo) group: the sum of every rank's input, this
    rank's ``1/D`` of it in ``output_tensor`` (module docstring). Install with
    ``FSDPModule.set_custom_reduce_scatter``. It completes before it returns, as FSDP2's own
    does (FSDP2 calls it without ``async_op``)."""

    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype,
                 device: torch.device) -> Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: Tensor, input_tensor: Tensor, group: dist.ProcessGroup,
                 op: object, async_op: bool = False) -> dist.Work | None:
        if op != dist.ReduceOp.SUM:
            raise ValueError(f"HostReduceScatter sums (op {op!r}): set the FSDP modules' "
                             f"set_force_sum_reduction_for_comms(True), as shard_stage does")
        LetGo(lambda summed: dist.all_reduce(summed, op=dist.ReduceOp.SUM, group=group,
                                             async_op=True), input_tensor).wait()
        output_tensor.copy_(input_tensor.chunk(group.size())[group.rank()])
        return None


class HostAllGather(AllGather):
    """FSDP2's all-gather on a host (gloo) group, its buffers let go on the rank's thread
    (module docstring). Install with ``FSDPModule.set_custom_all_gather``."""

    def allocate(self, size: Sequence[int | torch.SymInt], *, dtype: torch.dtype,
                 device: torch.device) -> Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: Tensor, input_tensor: Tensor, group: dist.ProcessGroup,
                 async_op: bool = False) -> dist.Work | None:
        work = LetGo(lambda out, inp: dist.all_gather_single(out, inp, group=group,
                                                             async_op=True),
                     output_tensor, input_tensor)
        if async_op:
            return work
        work.wait()
        return None
