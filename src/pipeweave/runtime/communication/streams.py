"""Point-to-point messages between GPUs on a CUDA stream of their own (NCCL wires only).

Compute runs on the rank's current (default) stream. NCCL runs each operation on an internal
stream that first waits for the stream that was current when the operation was posted. Posted
from the compute stream, an early (prefetched) receive would therefore wait for all the
compute queued before it, and the peer's matching send, queued on the same pair's NCCL
stream, behind it. So every send and receive is posted from a side stream, ``comm``, that
waits only for what a message needs::

    compute:  F(j) ──record sent_j──────────────── F(j+1) ─ wait got_k ─ B(k) ...
    comm:          wait sent_j ─ isend(j) ─ irecv(k) ─ wait(k) ─ record got_k
                                                      (the host does not wait)

* a send: an event recorded on the compute stream after the tensor was computed, the comm
  stream waits on it, the tensor is marked as used there (``record_stream``), the send is
  posted inside ``torch.cuda.stream(comm)``;
* a receive: its buffer is allocated and the receive posted inside the comm stream; before
  the tensor is used, the comm stream waits for the transfer (``Work.wait()`` with no
  timeout, which NCCL turns into a stream wait: a timeout would make the host poll until the
  transfer is done), an event is recorded there, the compute stream waits on it and the
  buffer is marked as used on the compute stream;
* every operation is posted as a ``batch_isend_irecv`` of its own (one NCCL group, on the
  process group's one communicator), a message's parts (its shape header and payload, or
  APC's two parts) one after the other, as the receiver posts them: each group meets
  exactly one group of the peer. The interpreter posts in the schedule's message order
  (:mod:`pipeweave.runtime.execution.posting`), which NCCL needs not to deadlock.

A peer that dies is then caught by NCCL's watchdog, which aborts the process group after the
group's timeout (``init_process_group(timeout=Job.timeout_s)``), not by a host wait. CPU
wires (gloo) never get here: :class:`~.transport.DistTransport` keeps its host-side waits
there. What this buys on a GPU (communication overlapping compute) has not been measured yet:
docs/gpu.md says what to check.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["MessageStreams"]


class MessageStreams:
    """The comm stream of one rank's device, and the events that order it with compute."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.comm = torch.cuda.Stream(device)

    def _compute(self) -> torch.cuda.Stream:
        return torch.cuda.current_stream(self.device)

    def send(self, parts: Sequence[tuple[Tensor, int]], dst: int) -> list[dist.Work]:
        """Post ``(tensor, tag)`` sends to ``dst`` on the comm stream, after the compute
        queued so far (which produced them); each part a group of its own, as the receiver
        posts them (a payload's receive is posted once its header arrived)."""
        ready = torch.cuda.Event()
        ready.record(self._compute())
        self.comm.wait_event(ready)
        for tensor, _ in parts:
            tensor.record_stream(self.comm)
        with torch.cuda.stream(self.comm):
            return [work for tensor, tag in parts for work in _issue([(dist.isend, tensor, dst, tag)])]

    @contextmanager
    def posting(self) -> Iterator[None]:
        """Allocate receive buffers and post receives inside this (on the comm stream)."""
        with torch.cuda.stream(self.comm):
            yield

    def recv(self, buffer: Tensor, src: int, tag: int) -> dist.Work:
        """Post one receive into ``buffer`` (allocated inside :meth:`posting`)."""
        with torch.cuda.stream(self.comm):
            (work,) = _issue([(dist.irecv, buffer, src, tag)])
        return work

    def arrived(self, work: dist.Work, buffer: Tensor) -> Tensor:
        """``buffer``, safe to use on the compute stream once ``work`` (its receive) is done:
        the compute stream waits for it on the device; the host does not."""
        with torch.cuda.stream(self.comm):
            work.wait()  # no timeout: NCCL orders the current (comm) stream after the transfer
            done = torch.cuda.Event()
            done.record(self.comm)
        compute = self._compute()
        compute.wait_event(done)
        buffer.record_stream(compute)
        return buffer


_Op = tuple[Callable[..., "dist.Work | None"], Tensor, int, int]


def _issue(ops: Sequence[_Op]) -> list[dist.Work]:
    """Post ``(isend or irecv, tensor, peer, tag)`` operations as one NCCL group: always one
    ``batch_isend_irecv``, even for one operation. torch puts a batch on the process group's
    own communicator, and a lone ``isend``/``irecv`` either on a two-rank communicator of the
    pair (a group not bound to a device: a lone receive would never meet a batched send) or,
    bound (``device_id``, as pipeweave makes it), on the group's with a warning that it
    serialises. Batched, every operation of a rank runs on one communicator, in posting
    order, whatever torch does with lone ones (:mod:`pipeweave.ir.rendezvous`)."""
    return list(dist.batch_isend_irecv([dist.P2POp(op, tensor, peer, tag=tag)
                                        for op, tensor, peer, tag in ops]))
