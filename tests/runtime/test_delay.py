"""PIPEWEAVE_INJECT_DELAY: messages leave late, the sender does not wait, order is kept."""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest
import torch
from torch import Tensor

from pipeweave.ir import Action, Op
from pipeweave.runtime.communication.delay import DelayedTransport, delayed_transport, parse_delay
from pipeweave.runtime.communication.transport import Waiting


class Recording:
    """A transport that records when each send reaches it."""

    def __init__(self, fail: bool = False) -> None:
        self.sent: list[tuple[float, Action]] = []
        self.finished = False
        self.fail = fail
        self.rendezvous = False

    def send(self, message: Action, tensor: Tensor, dst: int) -> None:
        if self.fail:
            raise ConnectionError("peer gone")
        self.sent.append((time.monotonic(), message))

    def recv(self, message: Action, src: int) -> Waiting:
        return torch.zeros(1)
        yield  # pragma: no cover

    def prefetch(self, message: Action, src: int) -> None:
        return None

    def all_reduce(self, key: Action, flat: Tensor, ranks: Sequence[int]) -> Waiting:
        return flat
        yield  # pragma: no cover

    def finish(self) -> None:
        self.finished = True


def test_parse_and_which_ranks() -> None:
    assert parse_delay("send=0.02") == (0.02, None)
    assert parse_delay("send=0.5,rank=1") == (0.5, 1)
    for bad in ("0.02", "send=-1", "send=x", "send=1,rank=a", "send=1,when=2"):
        with pytest.raises(ValueError, match="use send=SECONDS"):
            parse_delay(bad)
    inner = Recording()
    assert delayed_transport(inner, 0, {}) is inner
    assert delayed_transport(inner, 0, {"PIPEWEAVE_INJECT_DELAY": "send=0.1,rank=1"}) is inner
    assert delayed_transport(inner, 0, {"PIPEWEAVE_INJECT_DELAY": "send=0"}) is inner
    wrapped = delayed_transport(inner, 1, {"PIPEWEAVE_INJECT_DELAY": "send=0.1,rank=1"})
    assert isinstance(wrapped, DelayedTransport) and wrapped.seconds == 0.1
    inner.rendezvous = True  # NCCL: late sends would break the message order it needs
    with pytest.raises(ValueError, match="out of the message order NCCL needs"):
        delayed_transport(inner, 1, {"PIPEWEAVE_INJECT_DELAY": "send=0.1"})


def test_sends_arrive_late_in_order_without_blocking_the_sender() -> None:
    inner = Recording()
    wire = DelayedTransport(inner, 1.0)  # long enough that a busy machine cannot blur it
    messages = [Action(Op.SEND_ACT, 0, j) for j in range(3)]
    began = time.monotonic()
    for message in messages:
        wire.send(message, torch.zeros(1), 1)
    returned = time.monotonic()
    wire.finish()                                                   # drains, then finishes
    assert returned <= inner.sent[0][0]                             # returned before delivering
    assert [m for _, m in inner.sent] == messages and inner.finished
    assert all(t - began >= 1.0 for t, _ in inner.sent)


def test_a_failed_delayed_send_surfaces_on_the_rank() -> None:
    wire = DelayedTransport(Recording(fail=True), 0.0)
    wire.send(Action(Op.SEND_ACT, 0, 0), torch.zeros(1), 1)
    with pytest.raises(RuntimeError, match="a delayed send failed: peer gone"):
        wire.finish()
