"""What each rank of a real run posts to NCCL, recorded on the CPU.

Every rank of a job is assembled as the distributed executor assembles it
(:func:`~pipeweave.runtime.launch.assemble.assemble_rank`) with a :class:`DistTransport` on the
NCCL path (its comm stream, :class:`MessageStreams`), and runs its real interpreter in a
thread of this process. ``torch.cuda``'s streams and events and torch.distributed's
point-to-point calls are fakes (CPU tensors stand in for the GPU's): every
``batch_isend_irecv`` or lone ``isend``/``irecv`` a rank posts is recorded, in order, as a
:class:`~pipeweave.ir.rendezvous.Group`, and the message is delivered buffered (a receive's
wait returns once its send was posted), so the run completes and the recording holds the
posting order of the real code, which :func:`~pipeweave.ir.rendezvous.run_posted` then plays
out under NCCL's rendezvous semantics.
"""

from __future__ import annotations

import contextlib
import datetime
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

from pipeweave.ir.rendezvous import P2P, Group
from pipeweave.runtime import Job
from pipeweave.runtime.communication.streams import MessageStreams
from pipeweave.runtime.communication.transport import DistTransport
from pipeweave.runtime.launch.assemble import assemble_rank
from pipeweave.runtime.launch.prepare import prepare

__all__ = ["record_posting"]

TIMEOUT = datetime.timedelta(seconds=60)


class _Stream:
    def wait_event(self, event: object) -> None:
        return None


class _Event:
    def record(self, stream: object = None) -> None:
        return None


class _Wire:
    """Fakes of the CUDA stream API and NCCL point-to-point, shared by the rank threads."""

    def __init__(self, bound: bool) -> None:
        self.bound = bound
        """Process group bound to a device: every operation on its one communicator."""
        self.posted: dict[int, list[Group]] = {}
        self._mail: dict[tuple[int, int, int], list[torch.Tensor]] = {}
        self._ready = threading.Condition()
        self._local = threading.local()

    # -- which rank, which stream ---------------------------------------------------------
    def enter(self, rank: int) -> None:
        self._local.rank, self._local.stream, self._local.batch = rank, _Stream(), None
        self.posted[rank] = []

    def current(self, device: object = None) -> _Stream:
        stream: _Stream = self._local.stream
        return stream

    @contextlib.contextmanager
    def within(self, stream: _Stream) -> Iterator[None]:
        before, self._local.stream = self._local.stream, stream
        try:
            yield
        finally:
            self._local.stream = before

    # -- point-to-point ------------------------------------------------------------------
    def _record(self, op: P2P) -> None:
        if self._local.batch is not None:
            self._local.batch.append(op)
            return
        rank = self._local.rank
        channel = "group" if self.bound else f"pair {min(rank, op.peer)}-{max(rank, op.peer)}"
        self.posted[rank].append(Group((op,), channel))

    def isend(self, tensor: torch.Tensor, dst: int, tag: int = 0, **_: Any) -> "_Work":
        self._record(P2P(True, dst, tag))
        with self._ready:
            self._mail.setdefault((self._local.rank, dst, tag), []).append(tensor.clone())
            self._ready.notify_all()
        return _Work(None)

    def irecv(self, tensor: torch.Tensor, src: int, tag: int = 0, **_: Any) -> "_Work":
        self._record(P2P(False, src, tag))
        return _Work(lambda: self._deliver((src, self._local.rank, tag), tensor))

    def _deliver(self, key: tuple[int, int, int], into: torch.Tensor) -> None:
        with self._ready:
            if not self._ready.wait_for(lambda: self._mail.get(key), TIMEOUT.total_seconds()):
                raise RuntimeError(f"no message {key} (src, dst, tag) within {TIMEOUT}")
            into.copy_(self._mail[key].pop(0).reshape(into.shape))

    def batch(self, ops: list[Any]) -> list["_Work"]:
        self._local.batch = []
        try:
            works = [op.op(op.tensor, op.peer, tag=op.tag) for op in ops]
            group = tuple(self._local.batch)
        finally:
            self._local.batch = None
        self.posted[self._local.rank].append(Group(group, "group"))
        return works


class _Work:
    def __init__(self, deliver: Callable[[], None] | None) -> None:
        self._deliver = deliver

    def wait(self, timeout: object = None) -> bool:
        deliver, self._deliver = self._deliver, None
        if deliver is not None:
            deliver()
        return True

    def is_completed(self) -> bool:
        return self._deliver is None


class _Op:
    def __init__(self, op: Any, tensor: torch.Tensor, peer: int, tag: int = 0) -> None:
        self.op, self.tensor, self.peer, self.tag = op, tensor, peer, tag


def _install(monkeypatch: pytest.MonkeyPatch, wire: _Wire) -> None:
    monkeypatch.setattr(torch.cuda, "Stream", lambda *_, **__: _Stream())
    monkeypatch.setattr(torch.cuda, "Event", lambda *_, **__: _Event())
    monkeypatch.setattr(torch.cuda, "current_stream", wire.current)
    monkeypatch.setattr(torch.cuda, "stream", wire.within)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda tensor, stream: None)
    monkeypatch.setattr(dist, "isend", wire.isend)
    monkeypatch.setattr(dist, "irecv", wire.irecv)
    monkeypatch.setattr(dist, "batch_isend_irecv", wire.batch)
    monkeypatch.setattr(dist, "P2POp", _Op)


def record_posting(job: Job, monkeypatch: pytest.MonkeyPatch, *,
                   bound: bool = True) -> dict[int, list[Group]]:
    """Run ``job`` (one pipeline, no replicas) with every rank in a thread on the NCCL path;
    each rank's posted groups, in posting order. ``bound``: the process group is bound to a
    device (pipeweave's): lone operations share the group's communicator."""
    wire = _Wire(bound)
    _install(monkeypatch, wire)
    torch.manual_seed(job.seed)
    spec = job.model()
    prepared = prepare(job, spec=spec)
    host = torch.device("cpu")
    ranks = []
    for rank in range(prepared.schedule.num_ranks):
        transport = DistTransport(rank, host, TIMEOUT, send_thread=False,
                                  streams=MessageStreams(torch.device("cuda", 0)))
        transport.track_deliveries(prepared.schedule)
        ranks.append(assemble_rank(prepared, rank, device=host, transport=transport,
                                   session=prepared.session, spec=spec, apply_rng=False))
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        wire.enter(rank)
        try:
            for _ in ranks[rank].interpreter().run():
                raise AssertionError("the distributed transport never yields")
        except BaseException as error:  # surfaced below, on the test's thread
            errors.append(error)

    threads = [threading.Thread(target=run, args=(rank,), daemon=True) for rank in range(len(ranks))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT.total_seconds() * 2)
    if errors:
        raise errors[0]
    assert not any(thread.is_alive() for thread in threads), "a rank thread did not finish"
    return wire.posted
