"""The weight-semantics options a plan may carry (``Plan.semantics``), checked where they enter.

:class:`Semantics` holds one field per option; ``None`` means "not given", so the default
applies (:attr:`Semantics.backward_mode` and :attr:`Semantics.order` resolve it; ``alpha``'s
default depends on N and the runtime's averager applies it). Each option belongs to the
schedules whose semantics it changes, which say so on their registry entry
(:attr:`ScheduleInfo.semantics <pipeweave.schedules.ScheduleInfo.semantics>`); on any other
schedule it would do nothing, so :func:`check_semantics` refuses it rather than let it be
silently ignored. No torch here: the plan layer stays importable without it.

==============  ===========  =====================================================================
option          schedules    meaning (schedules: those declaring it, today)
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

In a plan's JSON only the options given are written (``{"backward": "graph"}``), and an
unknown name there is refused, as it is in any mapping handed to :meth:`Semantics.from_mapping`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ..schedules import available_schedules, get_info

__all__ = ["Semantics", "SEMANTICS_OPTIONS", "AVERAGE_ORDERS", "BACKWARD_MODES", "check_semantics",
           "schedules_taking"]

AVERAGE_ORDERS = ("simultaneous", "update-then-dilute")
"""``average_order`` values; the first is the default."""
BACKWARD_MODES = ("recompute", "graph")
"""``backward`` values; the first is the default."""


@dataclass(frozen=True)
class SemanticsOption:
    """Which values an option takes (the rule :func:`check_semantics` applies); where it
    applies is declared by the schedules (:attr:`pipeweave.schedules.ScheduleInfo.semantics`)."""

    valid: Callable[[Any], bool]
    expected: str
    flag: str


def _fraction(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value) and 0.0 <= value <= 1.0)


def _option(rule: SemanticsOption) -> Any:
    """A :class:`Semantics` field: ``None`` (not given) by default, its rule in the metadata."""
    return field(default=None, metadata={"rule": rule})


@dataclass(frozen=True)
class Semantics:
    """A plan's weight-semantics options; ``None`` in a field means the option was not given.

    Values are kept as given (an ``alpha`` of ``1`` stays ``1``), so a plan's JSON reads back
    byte for byte; :func:`check_semantics` checks them against the plan's schedule.
    """

    backward: str | None = _option(SemanticsOption(
        lambda v: v in BACKWARD_MODES, f"one of {list(BACKWARD_MODES)}",
        "--prediction-backward"))
    """PipeOptim only: how the backward treats the predicted forward weights. ``"recompute"``
    (default; pipeoptim.txt Algorithm 1) runs the forward under ``no_grad`` and recomputes the
    stage at the current weights in the backward; ``"graph"`` differentiates the graph built on
    the predicted weights (no second forward, one predicted copy per micro-batch in flight)."""

    alpha: float | None = _option(SemanticsOption(
        _fraction, "a number in [0, 1]", "--alpha"))
    """AvgPipe only: how far each parallel model is pulled toward the reference model per
    iteration, in [0, 1] (0: not at all, 1: replaced by it). Default ``1/N`` for N parallel
    pipelines (avgpipe.txt §3.2), which the runtime's averager applies when this is ``None``."""

    average_order: str | None = _option(SemanticsOption(
        lambda v: v in AVERAGE_ORDERS, f"one of {list(AVERAGE_ORDERS)}",
        "--average-order"))
    """AvgPipe only: ``"simultaneous"`` (default: dilute the weights as they were before the
    local update) or ``"update-then-dilute"`` (update first, then dilute the updated weights);
    see :mod:`pipeweave.runtime.averaging.elastic`."""

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any]) -> "Semantics":
        """The options of a plain mapping (a plan's JSON); ValueError for an unknown name."""
        if not isinstance(options, Mapping):
            raise TypeError(f"plan semantics must be a Semantics or a mapping of option names to "
                            f"values, got {type(options).__name__} {options!r}; e.g. "
                            f"{{'backward': 'graph'}}, or leave it out for the defaults")
        for name in options:
            if name not in SEMANTICS_OPTIONS:
                raise ValueError(
                    f"unknown weight-semantics option {name!r}; known: {sorted(SEMANTICS_OPTIONS)} "
                    f"(schedule options such as lookahead go in schedule_options / --option)")
        return cls(**options)

    def given(self) -> dict[str, Any]:
        """The options that were given, by name (what a plan's JSON holds)."""
        return {f.name: value for f in fields(self) if (value := getattr(self, f.name)) is not None}

    @property
    def backward_mode(self) -> str:
        """``backward``, or the default ``"recompute"``."""
        return BACKWARD_MODES[0] if self.backward is None else self.backward

    @property
    def order(self) -> str:
        """``average_order``, or the default ``"simultaneous"``."""
        return AVERAGE_ORDERS[0] if self.average_order is None else self.average_order


SEMANTICS_OPTIONS: dict[str, SemanticsOption] = {f.name: f.metadata["rule"] for f in fields(Semantics)}
"""Every option's rule, by name, in field order (read from :class:`Semantics`)."""


def schedules_taking(option: str) -> list[str]:
    """The registered schedules that declare ``option`` (their entry's ``semantics``)."""
    return [info.name for info in available_schedules() if option in info.semantics]


def check_semantics(schedule: str, semantics: Semantics) -> None:
    """ValueError naming the option and the fix for a misplaced or invalid option."""
    for name, value in semantics.given().items():
        option = SEMANTICS_OPTIONS[name]
        if name not in get_info(schedule).semantics:
            where = schedules_taking(name)
            raise ValueError(
                f"semantics option {name}={value!r} ({option.flag}) applies to "
                f"{', '.join(where) or 'no registered schedule'} only, not to schedule "
                f"{schedule!r}; drop it" + (f" or use --schedule {where[0]}" if where else ""))
        if not option.valid(value):
            raise ValueError(f"semantics option {name}={value!r} ({option.flag}) must be "
                             f"{option.expected}")
