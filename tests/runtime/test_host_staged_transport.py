"""Ranks sharing a GPU talk over gloo, which sends and receives host memory only: the
distributed transport copies a CUDA tensor to the host to send it and a received one back to
the rank's GPU (``DistTransport(wire=cpu)``, chosen by :mod:`pipeweave.devices`). Checked
without a GPU: fake CUDA tensors (``FakeTensorMode``) and torch.distributed's calls recorded."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode

from pipeweave.ir import Action, Op
from pipeweave.runtime.communication import transport as transport_module
from pipeweave.runtime.communication.transport import DistTransport

from test_apc_transport import _received
from test_message_streams import install_streams

CUDA = torch.device("cuda", 0)
HOST = torch.device("cpu")


class _Done:
    """A finished ``dist.Work``."""

    def wait(self, timeout: Any = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, torch.device]]]:
    """Every tensor handed to torch.distributed, as (call, device)."""
    seen: list[tuple[str, torch.device]] = []

    def record(name: str) -> Any:
        def call(tensor: Any, *args: Any, **kwargs: Any) -> _Done:
            for t in tensor if isinstance(tensor, list) else [tensor]:
                seen.append((name, t.device))
            return _Done()
        return call

    monkeypatch.setattr(dist, "isend", record("isend"))
    monkeypatch.setattr(dist, "irecv", record("irecv"))
    monkeypatch.setattr(dist, "all_gather", lambda out, own, **_: record("all_gather")(own))
    with FakeTensorMode(allow_non_fake_inputs=True):
        yield seen


def _transport(**kwargs: Any) -> DistTransport:
    return DistTransport(1, CUDA, datetime.timedelta(seconds=5), **kwargs)


def test_sends_and_receives_go_through_host_memory(calls: list) -> None:
    # (with --apc, the same path carries the encoded bytes: tests/cuda/, on a GPU)
    transport = _transport(wire=HOST)
    assert transport.send_thread  # gloo's isend can stall the rank: from the helper thread
    message = Action(Op.SEND_ACT, 0, 0)
    transport.send(message, torch.empty(4, 8, device=CUDA), 0)
    transport.finish()
    assert calls and {device for _, device in calls} == {HOST}  # header and payload
    calls.clear()
    kind = transport_module._kind(message, 0, 1)
    transport._shapes[kind] = (torch.Size([4, 8]), torch.float32)
    received = _received(transport.recv(message, 0))
    assert received.device == CUDA and received.shape == (4, 8)
    assert calls == [("irecv", HOST)]
    transport._groups[(0, 1)] = None  # type: ignore[assignment]
    total = _received(transport.all_reduce("key", torch.empty(3, device=CUDA), [0, 1]))
    assert total.device == CUDA and ("all_gather", HOST) in calls


def test_nccl_messages_stay_on_the_gpu(calls: list, monkeypatch: pytest.MonkeyPatch) -> None:
    install_streams(monkeypatch)  # NCCL messages go on a comm stream (test_message_streams.py)
    transport = _transport()
    assert transport.wire == CUDA and not transport.send_thread
    transport.send(Action(Op.SEND_ACT, 0, 0), torch.empty(4, 8, device=CUDA), 0)
    assert calls and {device for _, device in calls} == {CUDA}
