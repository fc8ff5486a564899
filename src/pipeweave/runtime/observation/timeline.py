"""Measured timelines: every rank records start/end of every action it runs.

Records are plain ``(rank, action_text, start_s, end_s)`` tuples, the same shape the
simulator's exports take, so a measured and a simulated timeline can be opened side by side.
Pipeline efficiency and bubble fraction follow DESIGN.md: efficiency = busy compute time over
all ranks / (ranks x wall time of the window); bubble = 1 - efficiency.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from ...ir import Op, parse_action

__all__ = ["Recorder", "Record", "efficiency"]

Record = tuple[int, str, float, float]


class Recorder:
    """Collects records for one rank; times are wall-clock seconds since ``origin``.

    Wall-clock (``time.time``) rather than a per-process monotonic clock, so that ranks in
    different processes, given one shared origin, land on one time axis.
    """

    def __init__(self, rank: int, origin: float | None = None) -> None:
        self.rank = rank
        self.origin = time.time() if origin is None else origin
        self.records: list[Record] = []

    def now(self) -> float:
        return time.time() - self.origin

    def add(self, text: str, start: float, end: float) -> None:
        self.records.append((self.rank, text, start, end))


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
