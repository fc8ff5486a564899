"""Host (gloo) collectives whose buffers are let go on the rank's own thread.

gloo runs a collective on a worker thread of its process group, and that thread drops its
references to the collective's tensors only after it has marked the work complete: a moment
after ``wait()`` returns on the rank's thread, later still on a loaded machine. When the rank
lets go of such a tensor first, the last reference, and so the free, is gloo's. torch's CPU
profiler records an allocator event only on a thread that profiles, so that free is never
seen, and ``Job.track_allocations`` (:mod:`..observation.allocations`) counted the buffer as
alive to the end of the run: on gpt-small's sharded last stage the reduce-scatters' input
copies (one block's gradient each, 265 or 528 kB) added up to 1.85 MB to a run's peak, in
about one run of two (docs/memory.md). The memory itself was free; only the count was wrong.

:class:`LetGo` runs such a collective on private handles of its tensors (views only it holds)
and its ``wait`` waits for gloo, then until gloo's thread has let go: each handle's use count
back to one (gloo keeps the handles it is given) and its storage's no higher than when the
collective was issued (gloo also keeps views of its own, such as an all-gather's output
chunks). That takes a few microseconds, and every free is then the rank's, counted when it
happens. :class:`HostReduceScatter` and :class:`HostAllGather` are FSDP2's two collectives on the host
done that way. gloo's own reduce-scatter (``reduce_scatter_tensor``) all-reduces a copy of the
input on its thread and copies this rank's chunk out; this one all-reduces FSDP2's input
buffer itself (FSDP2 reads it no more), so the sum and the wire are the same, bit for bit, and
the copy (one block's gradient) is not made at all.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

__all__ = ["LetGo", "HostReduceScatter", "HostAllGather", "LET_GO_S"]

LET_GO_S = 5.0
"""At most this long after a collective completes for gloo's thread to drop its references
(it takes microseconds); past it the rank goes on and only the profiler's count suffers."""


class LetGo(dist.Work):
    """A gloo collective, ``issue(*handles)`` with ``async_op=True``, on private handles of
    ``tensors``: ``wait`` returns once it is done and gloo holds none of them (module
    docstring)."""

    def __init__(self, issue: Callable[..., dist.Work | None], *tensors: Tensor) -> None:
        super().__init__()
        self._handles = [t.view(t.shape) for t in tensors]
        self._refs = [_storage_refs(h) for h in self._handles]
        self._work = issue(*self._handles)

    def _held(self) -> bool:
        return any(_tensor_refs(h) > 1 or _storage_refs(h) > refs
                   for h, refs in zip(self._handles, self._refs))

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        work, self._work = self._work, None
        if work is not None:
            work.wait(timeout)
        del work  # the rank's reference to gloo's work, which holds the handles
        deadline = time.monotonic() + LET_GO_S
        while self._held() and time.monotonic() < deadline:
            time.sleep(0)  # let gloo's thread run
        self._handles = []
        return True


def _tensor_refs(tensor: Tensor) -> int:
    """References to ``tensor`` itself (torch's, not Python's: gloo's work holds them)."""
    return int(tensor._use_count())  # type: ignore[attr-defined]  # not in torch's stubs


def _storage_refs(tensor: Tensor) -> int:
    """References to ``tensor``'s storage: one per tensor viewing it."""
    return int(torch._C._storage_Use_Count(tensor.untyped_storage()._cdata))


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
