"""The weight-semantics options a plan may carry (``Plan.semantics``), checked where they enter.

Each option belongs to the schedules whose semantics it changes; on any other schedule it would
do nothing, so it is refused rather than silently ignored. No torch here: the plan layer stays
importable without it.

==============  ===========  =====================================================================
option          schedules    meaning
==============  ===========  =====================================================================
backward        pipeoptim    ``recompute`` (default, Algorithm 1: the backward recomputes the
                             stage at the current weights) or ``graph`` (differentiate the graph
                             built on the predicted weights; with ``--recompute`` the predicted
                             copy is kept and the backward recomputes on it)
alpha           avgpipe      elastic-averaging pull toward the reference model, in [0, 1]
                             (default 1/N, avgpipe.txt §3.2)
average_order   avgpipe      ``simultaneous`` (default) or ``update-then-dilute`` (see
                             runtime/execution/elastic_averaging.py)
==============  ===========  =====================================================================
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["SEMANTICS_OPTIONS", "AVERAGE_ORDERS", "BACKWARD_MODES", "check_semantics"]

AVERAGE_ORDERS = ("simultaneous", "update-then-dilute")
BACKWARD_MODES = ("recompute", "graph")


@dataclass(frozen=True)
class SemanticsOption:
    schedules: tuple[str, ...]
    valid: Callable[[Any], bool]
    expected: str
    flag: str


def _fraction(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and 0.0 <= value <= 1.0)


SEMANTICS_OPTIONS: dict[str, SemanticsOption] = {
    "backward": SemanticsOption(("pipeoptim",), lambda v: v in BACKWARD_MODES,
                                f"one of {list(BACKWARD_MODES)}", "--prediction-backward"),
    "alpha": SemanticsOption(("avgpipe",), _fraction, "a number in [0, 1]", "--alpha"),
    "average_order": SemanticsOption(("avgpipe",), lambda v: v in AVERAGE_ORDERS,
                                     f"one of {list(AVERAGE_ORDERS)}", "--average-order"),
}


def check_semantics(schedule: str, semantics: Mapping[str, Any]) -> None:
    """ValueError naming the option and the fix for an unknown, misplaced or invalid option."""
    for name, value in semantics.items():
        option = SEMANTICS_OPTIONS.get(name)
        if option is None:
            raise ValueError(
                f"unknown weight-semantics option {name!r}; known: {sorted(SEMANTICS_OPTIONS)} "
                f"(schedule options such as lookahead go in schedule_options / --option)")
        if schedule not in option.schedules:
            raise ValueError(
                f"semantics option {name}={value!r} ({option.flag}) applies to "
                f"{', '.join(option.schedules)} only, not to schedule {schedule!r}; drop it or "
                f"use --schedule {option.schedules[0]}")
        if not option.valid(value):
            raise ValueError(f"semantics option {name}={value!r} ({option.flag}) must be "
                             f"{option.expected}")
