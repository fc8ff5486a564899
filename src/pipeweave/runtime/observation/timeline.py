"""Measured timelines: every rank records start/end of every action it runs.

Records are plain ``(rank, action_text, start_s, end_s)`` tuples, the same shape the
simulator's exports take, so a measured and a simulated timeline can be opened side by side.

On a GPU the host only queues work, so host clocks around an action say when it was queued,
not when it ran. There the recorder marks each action's start and end with CUDA events on
the compute stream and turns them into seconds when the records are read (after the run):
device time, so the bubble and samples/s in ``summary.json`` mean on a GPU what they mean on
a CPU. The events are placed on the wall-clock axis by one reference event recorded after a
synchronisation at the start, so ranks in different processes still share one axis. Nothing
waits for the GPU while the run goes on.
Pipeline efficiency and bubble fraction follow DESIGN.md: efficiency = busy compute time over
all ranks / (ranks x wall time of the window); bubble = 1 - efficiency.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Union

import torch

from ...ir import Op, parse_action

__all__ = ["Recorder", "Record", "efficiency"]

Record = tuple[int, str, float, float]
QUEUED = 4096
"""Actions queued with their events before those already run are turned into records."""
Mark = Union[float, "torch.cuda.Event"]
"""When something happened: seconds since the origin (CPU) or a CUDA event (GPU)."""


class Recorder:
    """Collects records for one rank; times are wall-clock seconds since ``origin``.

    Wall-clock (``time.time``) rather than a per-process monotonic clock, so that ranks in
    different processes, given one shared origin, land on one time axis. ``device``: a CUDA
    device times actions with events on it (module docstring).
    """

    def __init__(self, rank: int, origin: float | None = None,
                 device: torch.device | None = None) -> None:
        self.rank = rank
        self.origin = time.time() if origin is None else origin
        self._done: list[Record] = []
        self._queued: list[tuple[str, torch.cuda.Event, torch.cuda.Event]] = []
        self._reference: tuple[torch.cuda.Event, float] | None = None
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)
            zero = torch.cuda.Event(enable_timing=True)
            zero.record()
            self._reference = (zero, self.now())

    def now(self) -> float:
        return time.time() - self.origin

    def mark(self) -> Mark:
        """Now: host seconds on the CPU, an event queued on the compute stream on a GPU."""
        if self._reference is None:
            return self.now()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def add(self, text: str, start: Mark, end: Mark) -> None:
        if isinstance(start, float) and isinstance(end, float):
            self._done.append((self.rank, text, start, end))
        else:
            assert not isinstance(start, float) and not isinstance(end, float)
            self._queued.append((text, start, end))
            if len(self._queued) >= QUEUED:  # a long run holds records, not events
                self._resolve(wait=False)

    @property
    def records(self) -> list[Record]:
        """Every record so far; on a GPU this waits for the actions queued last."""
        self._resolve(wait=True)
        return self._done

    def ready_records(self) -> list[Record]:
        """The records of the actions that have run; never waits (on a GPU the last queued
        ones come later)."""
        self._resolve(wait=False)
        return self._done

    def _resolve(self, *, wait: bool) -> None:
        """Queued actions into records: all (waiting for the last), or those already done."""
        if not self._queued:
            return
        assert self._reference is not None
        zero, at = self._reference
        if wait:
            self._queued[-1][2].synchronize()
        done = 0
        for text, start, end in self._queued:
            if not wait and not end.query():
                break
            self._done.append((self.rank, text, at + zero.elapsed_time(start) / 1e3,
                               at + zero.elapsed_time(end) / 1e3))
            done += 1
        del self._queued[:done]


@dataclass(frozen=True)
class Efficiency:
    efficiency: float
    bubble_fraction: float
    window: tuple[float, float]
    busy_per_rank: tuple[float, ...]


def efficiency(records: Iterable[Record], ranks: int, *,
               window: tuple[float, float] | None = None) -> Efficiency:
    """Busy compute share over ``window`` (default: first compute start to last compute end)."""
    compute = [(r, s, e) for r, text, s, e in records
               if parse_action(text).op in (Op.FORWARD, Op.BACKWARD)]
    if not compute:
        return Efficiency(0.0, 1.0, (0.0, 0.0), tuple(0.0 for _ in range(ranks)))
    lo, hi = window if window is not None else (min(s for _, s, _ in compute),
                                                max(e for _, _, e in compute))
    busy = [0.0] * ranks
    for rank, start, end in compute:
        overlap = min(end, hi) - max(start, lo)
        if overlap > 0:
            busy[rank] += overlap
    span = max(hi - lo, 1e-12)
    eff = sum(busy) / (ranks * span)
    return Efficiency(eff, 1.0 - eff, (lo, hi), tuple(busy))
