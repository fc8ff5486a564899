"""AdvanceOptions: AvgPipe's advance chosen at run time (avgpipe.txt §4.2, Algorithm 1).

Plain, picklable data on the :class:`~pipeweave.runtime.job.Job` (``job.advance``); the
mechanics live in :mod:`pipeweave.runtime.advance.online` (one iteration at a time, the
decision shared by all ranks) and :mod:`pipeweave.avgpipe.controller` (the state machine).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["AdvanceOptions", "TimeSource"]

TimeSource = Callable[[int, float], float]
"""``(advance, measured seconds) -> seconds`` the controller is told an iteration took."""


@dataclass(frozen=True)
class AdvanceOptions:
    """Run ``avgpipe`` starting at 1F1B (advance 0) and let Algorithm 1 raise the advance.

    Attributes:
        memory_limit: bytes per device that the controller keeps the peak under (model state
            plus peak activations, counted as :mod:`pipeweave.runtime.observation.memory` does); ``None``:
            no limit, the advance rises while iterations get faster.
        samples: iterations measured per advance; the controller takes their median.
        tolerance: relative gain an advance must show to count as faster (measured times
            are noisy; 0 is the paper's literal ``is_faster``).
        patience: raises that are not faster tolerated before settling (crosses plateaus).
        warmup: first iterations run at advance 0 and not measured (start-up costs:
            allocator, thread pools, the first message of each kind).
        time_source: replaces the measured time, e.g. with the simulator's time for the
            advance used (deterministic tests: :class:`pipeweave.avgpipe.simulated.SimulatedTime`).
            Must be picklable (it travels to every rank); every rank calls it with the same
            arguments, so it must be deterministic.
        fixed: measure without deciding: every iteration runs alone at this advance (``"all"``:
            AFAB) and is logged like the controller's, so fixed advances can be compared with
            the chosen one on the same footing (benchmarks/avgpipe_advance.py ``--real``).
    """

    memory_limit: float | None = None
    samples: int = 3
    tolerance: float = 0.02
    patience: int = 1
    warmup: int = 1
    time_source: TimeSource | None = None
    fixed: int | str | None = None

    def __post_init__(self) -> None:
        if self.memory_limit is not None and not (self.memory_limit > 0
                                                  and not math.isnan(self.memory_limit)):
            raise ValueError(f"memory_limit must be > 0 bytes (or None: no limit), got "
                             f"{self.memory_limit!r}; e.g. --memory-limit 8GB")
        for name in ("samples", "patience", "warmup"):
            value = getattr(self, name)
            least = 1 if name == "samples" else 0
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"advance {name} must be an integer >= {least}, got {value!r}")
        if self.fixed is not None and self.fixed != "all" and (
                isinstance(self.fixed, bool) or not isinstance(self.fixed, int) or self.fixed < 0):
            raise ValueError(f"advance fixed={self.fixed!r} must be an integer >= 0, 'all' or "
                             f"None (let the controller choose)")
        if not 0 <= self.tolerance < 1:
            raise ValueError(f"advance tolerance must lie in [0, 1), got {self.tolerance!r}")
