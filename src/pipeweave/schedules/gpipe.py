"""GPipe: all forwards, then all backwards, then a flush and one update per iteration.

P=3, M=3 (iteration time (M+P-1)(F+B), bubble (P-1)/(M+P-1))::

    rank0  F0 F1 F2 .  .  .  .  B0 B1 B2 .  .
    rank1  .  F0 F1 F2 .  .  B0 B1 B2 .  .  .
    rank2  .  .  F0 F1 F2 B0 B1 B2 .  .  .  .
"""

from __future__ import annotations

from collections.abc import Sequence

from ..ir import Op, Schedule
from .common import flush_schedule
from .registry import Shape, register

__all__ = ["gpipe", "gpipe_order"]


def gpipe_order(position: int, depth: int, microbatches: Sequence[int]) -> list[tuple[Op, int]]:
    """Every forward of the iteration, then every backward in the same order."""
    return [(Op.FORWARD, j) for j in microbatches] + [(Op.BACKWARD, j) for j in microbatches]


@register("gpipe", description="all forwards, then all backwards; flush and update per iteration",
          paper="Y. Huang et al., GPipe, NeurIPS 2019 (as described in Yang et al., WPipe, ICLR 2022, §2)", synchronous=True,
          width=True, replicas=True, chunks=None, torch_schedule="GPipe")
def gpipe(shape: Shape) -> Schedule:
    return flush_schedule("gpipe", shape, gpipe_order)
