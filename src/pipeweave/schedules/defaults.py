"""A schedule's own defaults for a run: chunks, the least micro-batch count, the optimizer.

Whoever builds a run of a schedule without choosing everything (``pipeweave train``, the
soak and GPU benchmarks, the long-run tests) asks :func:`schedule_defaults`, so that all of
them run a schedule the same way: its ``default_chunks`` (WPipe's two groups, interleaving),
at least its ``min_microbatches`` (2BW needs M >= P), and its ``default_optimizer``
(SpecTrain's SGD with momentum) where it names one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .registry import Shape, get_info

__all__ = ["ScheduleDefaults", "schedule_defaults", "FALLBACK_OPTIMIZER"]

FALLBACK_OPTIMIZER: tuple[str, Mapping[str, Any]] = ("adam", {"lr": 1e-3})
"""The optimizer of a schedule that names none (``torch.optim.Adam``, lr 1e-3)."""


@dataclass(frozen=True)
class ScheduleDefaults:
    """What a run of ``schedule`` uses where the caller chose nothing."""

    schedule: str
    stages: int
    """Pipeline depth P the defaults are for (``min_microbatches`` depends on it)."""
    chunks: int
    """Model chunks per rank: the one asked for, else the schedule's ``default_chunks``."""
    microbatches: int
    """M: the one asked for, raised to the schedule's least for this shape."""
    optimizer: tuple[str, Mapping[str, Any]]
    """``(name, kwargs)``: the schedule's ``default_optimizer``, else the fallback given."""


def schedule_defaults(schedule: str, stages: int, *, microbatches: int = 1,
                      chunks: int | None = None, width: int = 1,
                      optimizer: tuple[str, Mapping[str, Any]] = FALLBACK_OPTIMIZER,
                      ) -> ScheduleDefaults:
    """The defaults of ``schedule`` at depth ``stages`` (module docstring).

    ``microbatches``: the M wanted, raised to what the schedule needs; ``chunks``: given
    chunks (None: the schedule's own); ``optimizer``: used when the schedule names none.
    """
    info = get_info(schedule)
    chunks = info.default_chunks if chunks is None else chunks
    least = info.min_microbatches(Shape(stages=stages, microbatches=1, chunks=chunks,
                                        width=width))
    return ScheduleDefaults(schedule=schedule, stages=stages, chunks=chunks,
                            microbatches=max(microbatches, least),
                            optimizer=info.default_optimizer or optimizer)
