"""A host (gloo) collective's buffers let go on the rank's own thread.

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
happens.
"""

from __future__ import annotations

import datetime
import time
import warnings
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["LetGo", "LET_GO_S"]

LET_GO_S = 0.25
"""At most this long after a collective completes for gloo's thread to drop its references
(it takes microseconds, a scheduler's time slice on a loaded machine); past it the rank goes
on, says so once, and only the profiler's count suffers."""


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
        while self._held():
            if time.monotonic() > deadline:
                warnings.warn(f"a gloo collective's buffers were still held {LET_GO_S} s "
                              f"after it completed; Job.track_allocations may count them "
                              f"alive after their free (runtime/communication/let_go.py)",
                              RuntimeWarning, stacklevel=2)
                break
            time.sleep(0)  # let gloo's thread run
        self._handles = []
        return True


def _tensor_refs(tensor: Tensor) -> int:
    """References to ``tensor`` itself (torch's, not Python's: gloo's work holds them)."""
    return int(tensor._use_count())  # type: ignore[attr-defined]  # not in torch's stubs


def _storage_refs(tensor: Tensor) -> int:
    """References to ``tensor``'s storage: one per tensor viewing it."""
    return int(torch._C._storage_Use_Count(tensor.untyped_storage()._cdata))
