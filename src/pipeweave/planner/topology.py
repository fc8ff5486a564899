"""The cluster as PipeDream's optimizer sees it: hierarchical levels of machines and links.

pipedream.txt §3.1, Fig. 7: level ``k`` is ``m_k`` components of level ``k-1`` joined by links
of bandwidth ``B_k``; level 0 is one device. Two servers of four GPUs each::

    level 2:  [ server ]====B_2====[ server ]          m_2 = 2
    level 1:  [g g g g]            [g g g g]           m_1 = 4, GPUs joined by B_1

    Topology.parse("4x1.2e10,2x1.25e9") == Topology((Level(4, 1.2e10), Level(2, 1.25e9)))

Levels are listed lowest first. The number of workers is the product of the machine counts.
A bandwidth of ``inf`` means communication is free on that level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Level", "Topology"]


@dataclass(frozen=True)
class Level:
    """``machines`` components of the level below, joined by links of ``bandwidth`` bytes/s."""

    machines: int
    bandwidth: float

    def __post_init__(self) -> None:
        if isinstance(self.machines, bool) or not isinstance(self.machines, int) or self.machines < 1:
            raise ValueError(f"a topology level needs an integer machine count >= 1, got "
                             f"{self.machines!r}")
        if not isinstance(self.bandwidth, (int, float)) or isinstance(self.bandwidth, bool) \
                or math.isnan(self.bandwidth) or self.bandwidth <= 0:
            raise ValueError(f"a topology level needs a bandwidth > 0 bytes/s, got {self.bandwidth!r}")
        object.__setattr__(self, "bandwidth", float(self.bandwidth))


@dataclass(frozen=True)
class Topology:
    """Hierarchical levels, lowest first (see the module docstring)."""

    levels: tuple[Level, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "levels", tuple(self.levels))
        if not self.levels:
            raise ValueError("a topology needs at least one level, e.g. Topology.single(4, 1e9)")

    @classmethod
    def single(cls, workers: int, bandwidth: float = math.inf) -> "Topology":
        """One level of ``workers`` devices joined by ``bandwidth`` bytes/s."""
        return cls((Level(workers, bandwidth),))

    @classmethod
    def parse(cls, text: str) -> "Topology":
        """``"MACHINESxBANDWIDTH[,MACHINESxBANDWIDTH...]"``, lowest level first."""
        levels = []
        for part in text.split(","):
            machines, sep, bandwidth = part.strip().partition("x")
            try:
                if not sep:
                    raise ValueError
                levels.append(Level(int(machines), float(bandwidth)))
            except ValueError as error:
                detail = f" ({error})" if str(error) else ""
                raise ValueError(
                    f"--topology {text!r}: level {part.strip()!r} must be MACHINESxBANDWIDTH with "
                    f"bandwidth in bytes/s{detail}, e.g. --topology 4x1.2e10,2x1.25e9 (4 GPUs per "
                    "server, 2 servers)"
                ) from None
        return cls(tuple(levels))

    @property
    def workers(self) -> int:
        return math.prod(level.machines for level in self.levels)

    def to_json(self) -> list[dict[str, float | None]]:
        return [{"machines": level.machines,
                 "bandwidth": None if math.isinf(level.bandwidth) else level.bandwidth}
                for level in self.levels]

    def __str__(self) -> str:
        return ",".join(f"{level.machines}x{level.bandwidth:g}" for level in self.levels)
