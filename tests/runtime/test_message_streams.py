"""Messages between GPUs go on a CUDA stream of their own (:mod:`pipeweave.runtime.communication.streams`).

Checked without a GPU: ``torch.cuda``'s streams, events and stream context, ``record_stream``
and torch.distributed's point-to-point calls are replaced by fakes that log, in order, what
was called on which stream; messages go through a fake wire (a dict by tag), so a send and
its receive round-trip real tensors. What must hold: a send is posted inside the comm stream
after that stream waited on an event recorded on the compute stream; a receive is posted
there too, and before the tensor is handed over the compute stream waits on an event the
comm stream recorded after the transfer; the host never waits with a timeout (on NCCL that
polls until the transfer is done); every operation goes in a batch of its own (one
communicator, one NCCL group meeting one of the peer's), header before payload; the CPU
(gloo) path never touches CUDA.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.distributed as dist

from pipeweave.ir import Action, Op
from pipeweave.runtime.communication.streams import MessageStreams
from pipeweave.runtime.communication.transport import DistTransport

from test_apc_transport import _received

CUDA = torch.device("cuda", 0)
TIMEOUT = datetime.timedelta(seconds=5)


class FakeCuda:
    """Streams, events and the current stream, logging every call in order."""

    def __init__(self) -> None:
        self.log: list[tuple[Any, ...]] = []
        self.compute = FakeStream(self, "compute")
        self.current = self.compute
        self._names = itertools.count()

    def event(self, *_: Any, **__: Any) -> "FakeEvent":
        return FakeEvent(self, f"e{next(self._names)}")

    def stream(self, device: Any = None, priority: int = 0) -> "FakeStream":
        return FakeStream(self, "comm")

    @contextlib.contextmanager
    def within(self, stream: "FakeStream") -> Iterator[None]:
        before, self.current = self.current, stream
        self.log.append(("enter", stream.name))
        try:
            yield
        finally:
            self.current = before
            self.log.append(("exit", stream.name))


@dataclass
class FakeStream:
    cuda: FakeCuda
    name: str

    def wait_event(self, event: "FakeEvent") -> None:
        self.cuda.log.append(("wait_event", self.name, event.name))


@dataclass
class FakeEvent:
    cuda: FakeCuda
    name: str

    def record(self, stream: FakeStream | None = None) -> None:
        where = stream if stream is not None else self.cuda.current
        self.cuda.log.append(("record", self.name, where.name))


class FakeWork:
    def __init__(self, cuda: FakeCuda, what: str) -> None:
        self.cuda, self.what = cuda, what

    def wait(self, timeout: Any = None) -> bool:
        self.cuda.log.append(("wait", self.what, self.cuda.current.name, timeout))
        return True

    def is_completed(self) -> bool:
        return True


@dataclass
class FakeOp:
    op: Any
    tensor: torch.Tensor
    peer: int
    tag: int


def install_streams(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    """Fakes for ``torch.cuda``'s streams and events, ``record_stream`` and
    ``batch_isend_irecv`` (which runs each op), logging to the returned object."""
    cuda = FakeCuda()

    def batch(ops: list[FakeOp]) -> list[FakeWork]:
        cuda.log.append(("batch", cuda.current.name, len(ops)))
        return [op.op(op.tensor, op.peer, tag=op.tag) for op in ops]

    monkeypatch.setattr(torch.cuda, "Stream", cuda.stream)
    monkeypatch.setattr(torch.cuda, "Event", cuda.event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: cuda.current)
    monkeypatch.setattr(torch.cuda, "stream", cuda.within)
    monkeypatch.setattr(torch.Tensor, "record_stream",
                        lambda tensor, stream: cuda.log.append(("record_stream", stream.name)))
    monkeypatch.setattr(dist, "batch_isend_irecv", batch)
    monkeypatch.setattr(dist, "P2POp", lambda op, tensor, peer, tag=0: FakeOp(op, tensor, peer, tag))
    return cuda


def install(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    """:func:`install_streams`, and torch.distributed's point-to-point calls on a fake wire
    (a dict by tag)."""
    cuda = install_streams(monkeypatch)
    wire: dict[int, torch.Tensor] = {}

    def isend(tensor: torch.Tensor, dst: int, tag: int = 0, **_: Any) -> FakeWork:
        wire[tag] = tensor.clone()
        cuda.log.append(("isend", cuda.current.name, tag))
        return FakeWork(cuda, f"isend {tag}")

    def irecv(tensor: torch.Tensor, src: int, tag: int = 0, **_: Any) -> FakeWork:
        if tag in wire:
            tensor.copy_(wire.pop(tag).reshape(tensor.shape))
        cuda.log.append(("irecv", cuda.current.name, tag))
        return FakeWork(cuda, f"irecv {tag}")

    monkeypatch.setattr(dist, "isend", isend)
    monkeypatch.setattr(dist, "irecv", irecv)
    return cuda


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    return install(monkeypatch)


def _pair(cuda: FakeCuda) -> tuple[DistTransport, DistTransport]:
    """Rank 0 and rank 1 on a GPU wire (CPU tensors stand in for the GPU's)."""
    host = torch.device("cpu")
    return tuple(DistTransport(rank, host, TIMEOUT, send_thread=False,  # type: ignore[return-value]
                               streams=MessageStreams(CUDA)) for rank in (0, 1))


def _index(log: list[tuple[Any, ...]], entry: tuple[Any, ...], start: int = 0) -> int:
    return log.index(entry, start)


def test_a_send_waits_for_compute_and_runs_on_the_comm_stream(cuda: FakeCuda) -> None:
    sender, _ = _pair(cuda)
    sender.send(Action(Op.SEND_ACT, 0, 0), torch.ones(2, 3), 1)
    log = cuda.log
    recorded = next(e for e in log if e[0] == "record")
    assert recorded[2] == "compute"  # after the compute that produced the tensor
    waited = _index(log, ("wait_event", "comm", recorded[1]))
    entered = _index(log, ("enter", "comm"), waited)
    sends = [i for i, e in enumerate(log) if e[0] == "isend"]
    assert len(sends) == 2  # the kind's shape header and the payload
    assert all(log[i][1] == "comm" and i > entered for i in sends)
    batches = [i for i, e in enumerate(log) if e[0] == "batch"]
    assert [log[i] for i in batches] == [("batch", "comm", 1)] * 2  # one group per part
    assert batches[0] < sends[0] < batches[1] < sends[1]  # header, then payload
    marks = [i for i, e in enumerate(log) if e == ("record_stream", "comm")]
    assert len(marks) == 2 and max(marks) < sends[0]  # both tensors kept for the comm stream


def test_the_consumer_waits_for_the_receive_before_using_it(cuda: FakeCuda) -> None:
    sender, receiver = _pair(cuda)
    message = Action(Op.SEND_ACT, 0, 0)
    first = torch.arange(6.0).reshape(2, 3)
    sender.send(message, first, 1)
    assert torch.equal(_received(receiver.recv(message, 0)), first)
    sender.send(Action(Op.SEND_ACT, 0, 1), first + 1, 1)
    receiver.prefetch(Action(Op.SEND_ACT, 0, 1), 0)  # posted early, as the interpreter does
    cuda.log.clear()
    received = _received(receiver.recv(Action(Op.SEND_ACT, 0, 1), 0))
    cuda.log.append(("used",))
    assert torch.equal(received, first + 1)
    log = cuda.log
    assert not any(e[0] == "irecv" for e in log)  # the prefetched receive, not a new one
    waited = next(i for i, e in enumerate(log) if e[0] == "wait")
    assert log[waited][2] == "comm" and log[waited][3] is None  # no host wait (no timeout)
    done = next(e for e in log[waited:] if e[0] == "record")
    assert done[2] == "comm"
    consumer = _index(log, ("wait_event", "compute", done[1]), waited)
    kept = _index(log, ("record_stream", "compute"), consumer)
    assert kept < _index(log, ("used",))


def test_receives_are_posted_on_the_comm_stream(cuda: FakeCuda) -> None:
    sender, receiver = _pair(cuda)
    sender.send(Action(Op.SEND_GRAD, 1, 0), torch.ones(4), 0)
    cuda.log.clear()
    _received(receiver.recv(Action(Op.SEND_GRAD, 1, 0), 1))  # header, then payload
    receives = [e for e in cuda.log if e[0] == "irecv"]
    assert len(receives) == 2 and {e[1] for e in receives} == {"comm"}


def test_delivered_sends_and_all_reduces_never_make_the_host_wait(cuda: FakeCuda) -> None:
    sender, receiver = _pair(cuda)
    for j in range(3):
        sender.send(Action(Op.SEND_ACT, 0, j), torch.full((2,), float(j)), 1)
        _received(receiver.recv(Action(Op.SEND_ACT, 0, j), 0))
    sender.finish()
    receiver._groups[(0, 1)] = None  # type: ignore[assignment]
    gathered: list[Any] = []

    def all_gather(out: list[torch.Tensor], own: torch.Tensor, **_: Any) -> FakeWork:
        for part in out:
            part.copy_(own)
        gathered.append(own)
        return FakeWork(cuda, "all_gather")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dist, "all_gather", all_gather)
        total = _received(receiver.all_reduce("key", torch.ones(3), [0, 1]))
    assert torch.equal(total, torch.full((3,), 2.0)) and gathered
    assert [e for e in cuda.log if e[0] == "wait" and e[3] is not None] == []


def test_apc_messages_round_trip_on_the_comm_stream(cuda: FakeCuda) -> None:
    host = torch.device("cpu")
    sender, receiver = (DistTransport(rank, host, TIMEOUT, send_thread=False, apc=True,
                                      streams=MessageStreams(CUDA)) for rank in (0, 1))
    tensor = torch.tensor([1.0, 1e30, -3.0])  # fp16 cannot hold it: the two-part fallback
    sender.send(Action(Op.SEND_ACT, 0, 0), tensor, 1)
    assert [e for e in cuda.log if e[0] == "batch"] == [("batch", "comm", 1)] * 3  # header,
    # first part and the rest, each a group of its own
    assert torch.equal(_received(receiver.recv(Action(Op.SEND_ACT, 0, 0), 0)), tensor)


def test_the_host_wire_never_touches_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = install(monkeypatch)

    def refuse(*_: Any, **__: Any) -> None:
        raise AssertionError("a gloo transport made a CUDA stream or event")

    monkeypatch.setattr(torch.cuda, "Stream", refuse)
    monkeypatch.setattr(torch.cuda, "Event", refuse)
    sender, receiver = (DistTransport(rank, torch.device("cpu"), TIMEOUT, send_thread=False)
                        for rank in (0, 1))
    assert sender._streams is None and receiver._streams is None
    sender.send(Action(Op.SEND_ACT, 0, 0), torch.ones(2), 1)
    assert torch.equal(_received(receiver.recv(Action(Op.SEND_ACT, 0, 0), 0)), torch.ones(2))
    assert {e[0] for e in cuda.log} == {"isend", "irecv", "wait"}  # no batch, no stream
    assert all(e[3] == TIMEOUT for e in cuda.log if e[0] == "wait")  # gloo: the host waits
