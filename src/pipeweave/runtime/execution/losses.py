"""The last stage's losses, read without stalling the GPU (issue 25).

Reading a CUDA tensor's value (``float(loss)``) waits until every kernel queued before it has
run: once per micro-batch, the host then idles while the GPU drains, and the GPU idles while
the host queues the next forward. On a GPU the loss is therefore copied to pinned host memory
asynchronously, behind an event. On every device a value is read between actions, never
inside a forward or backward: after each optimizer step of the last stage, the values already
computed (on a GPU, those whose event has passed: it never waits), and every value when the
whole record is asked for (results, checkpoints, a failed run's report).
``tests/runtime/test_no_sync.py`` counts the reads.

A non-finite loss stops the run with :class:`FloatingPointError` naming the micro-batch when
its value is read: at the optimizer step that follows on the CPU, within about an iteration on
a GPU.
"""

from __future__ import annotations

import math
from collections import deque

import torch
from torch import Tensor

__all__ = ["LossLog"]

SLOTS = 1024
"""Pinned host slots in flight per stage; when all hold unread values, the oldest is waited for."""


class LossLog:
    """Per micro-batch, the weighted loss a last stage computed (summed over pieces)."""

    def __init__(self, stage: int) -> None:
        self.stage = stage
        self._values: dict[int, float] = {}
        self._unread: deque[tuple[int, Tensor, torch.cuda.Event | None]] = deque()
        self._host: Tensor | None = None
        self._next_slot = 0
        self._diverged = False

    def add(self, microbatch: int, loss: Tensor) -> None:
        """Record ``loss`` (a scalar, maybe still being computed on a GPU) for ``microbatch``."""
        if loss.device.type != "cuda":
            self._unread.append((microbatch, loss.detach(), None))
            return
        if self._host is None:
            self._host = torch.empty(SLOTS, dtype=torch.float64, pin_memory=True)
        if len(self._unread) >= SLOTS:
            self._read(wait=True, limit=len(self._unread) - SLOTS + 1)
        slot = self._next_slot
        self._next_slot = (slot + 1) % SLOTS
        self._host[slot].copy_(loss.detach().to(torch.float64), non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._unread.append((microbatch, self._host[slot], event))

    def values(self, *, wait: bool = True) -> dict[int, float]:
        """Every loss read so far; ``wait``: first wait for those still being computed."""
        self._read(wait=wait)
        return self._values

    def forget(self, microbatch: int) -> None:
        """Drop ``microbatch``'s loss (its forward runs again)."""
        self._read(wait=True)
        self._values.pop(microbatch, None)

    def restore(self, history: dict[int, float]) -> None:
        """Losses of steps a checkpoint restored."""
        self._values.update(history)

    def _read(self, *, wait: bool, limit: int | None = None) -> None:
        read = 0
        while self._unread and (limit is None or read < limit):
            microbatch, value, event = self._unread[0]
            if event is not None:
                if not wait and not event.query():
                    return
                event.synchronize()
            self._unread.popleft()
            self._store(microbatch, float(value))
            read += 1

    def _store(self, microbatch: int, value: float) -> None:
        self._values[microbatch] = self._values.get(microbatch, 0.0) + value
        if not math.isfinite(value) and not self._diverged:
            self._diverged = True  # said once: a failed run's report reads the rest quietly
            raise FloatingPointError(
                f"loss became {value} at micro-batch {microbatch} (stage {self.stage}); lower "
                f"the learning rate or check the data")
