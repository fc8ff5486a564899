"""Injected communication delay: every message a rank sends arrives ``seconds`` later.

``PIPEWEAVE_INJECT_DELAY="send=0.02"`` (every rank) or ``"send=0.02,rank=0"`` (one rank)
makes each activation and gradient that rank sends leave ``send`` seconds after the schedule
sends it. It models link *latency*, the cost AvgPipe's advance forward propagation hides
(avgpipe.txt §4.1, Fig. 7): the sender does not wait, it goes on computing while a helper
thread holds the message back, so a schedule that has work to overlap (AFAB, or 1F1B with
forwards in advance) loses little and 1F1B's alternating waits lose the most::

    rank:    F0 SF0 F1 SF1 F2 ...          (sends return at once)
    delay:       ├── d ──┤ isend SF0
                     ├── d ──┤ isend SF1   (in order, each d after it was sent)

Distributed runs only (gloo/CPU; the single-process executor has no wall-clock links). Like
:mod:`.faults`, read from the environment on every rank, so a ``pipeweave train`` run (or
torchrun) can be slowed down from outside; benchmarks/avgpipe_advance.py ``--real`` uses it.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Hashable, Mapping, Sequence

from torch import Tensor

from ...ir import Action
from .transport import Transport, Waiting

__all__ = ["DELAY_ENV", "parse_delay", "delayed_transport", "DelayedTransport"]

DELAY_ENV = "PIPEWEAVE_INJECT_DELAY"


def parse_delay(text: str) -> tuple[float, int | None]:
    """``"send=S[,rank=R]"`` as ``(seconds, rank or None)``; ValueError naming the form."""
    fields = dict(part.partition("=")[::2] for part in text.split(",") if part)
    try:
        if set(fields) - {"send", "rank"} or "send" not in fields:
            raise ValueError
        seconds = float(fields["send"])
        rank = int(fields["rank"]) if "rank" in fields else None
        if not seconds >= 0 or (rank is not None and rank < 0):
            raise ValueError
    except ValueError:
        raise ValueError(f"{DELAY_ENV}={text!r} is invalid; use send=SECONDS[,rank=R] with "
                         f"SECONDS >= 0 (e.g. send=0.02: every message arrives 20 ms late)") from None
    return seconds, rank


def delayed_transport(transport: Transport, rank: int,
                      environ: Mapping[str, str] | None = None) -> Transport:
    """``transport``, or a :class:`DelayedTransport` around it when ``PIPEWEAVE_INJECT_DELAY``
    asks for one on ``rank``."""
    text = (os.environ if environ is None else environ).get(DELAY_ENV)
    if not text:
        return transport
    seconds, only = parse_delay(text)
    if seconds == 0 or (only is not None and only != rank):
        return transport
    if transport.rendezvous:
        raise ValueError(f"{DELAY_ENV}={text!r} posts sends late from a helper thread, out of the "
                         f"message order NCCL needs (runtime/execution/posting.py); inject the "
                         f"delay on a gloo run (CPU), or unset {DELAY_ENV}")
    return DelayedTransport(transport, seconds)


class DelayedTransport:
    """Wraps a transport; its sends are handed on ``seconds`` later by a helper thread."""

    def __init__(self, inner: Transport, seconds: float) -> None:
        self.inner = inner
        self.seconds = seconds
        self._queue: queue.SimpleQueue[tuple[float, Action, Tensor, int] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def bytes_sent(self) -> int:
        return self.inner.bytes_sent

    def send(self, message: Action, tensor: Tensor, dst: int) -> None:
        self._raise()
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="pipeweave-delay", daemon=True)
            self._thread.start()
        # The schedule may reuse the tensor's memory once sent only if the transport copied
        # it; DistTransport keeps a reference until delivery, so holding one here is the same.
        self._queue.put((time.monotonic() + self.seconds, message, tensor, dst))

    def _loop(self) -> None:
        while (item := self._queue.get()) is not None:
            due, message, tensor, dst = item
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            try:
                self.inner.send(message, tensor, dst)
            except BaseException as error:  # surfaced on the rank's thread by _raise
                self._error = error
                return

    def _raise(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"a delayed send failed: {self._error}") from self._error

    def _drain(self) -> None:
        """Hand on every held message (the inner transport then owns them)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        self._raise()

    def recv(self, message: Action, src: int) -> Waiting:
        self._raise()
        return (yield from self.inner.recv(message, src))

    @property
    def rendezvous(self) -> bool:
        return self.inner.rendezvous

    def prefetch(self, message: Action, src: int) -> None:
        self.inner.prefetch(message, src)

    def all_reduce(self, key: Hashable, flat: Tensor, ranks: Sequence[int]) -> Waiting:
        return (yield from self.inner.all_reduce(key, flat, ranks))

    def finish(self) -> None:
        self._drain()
        self.inner.finish()
