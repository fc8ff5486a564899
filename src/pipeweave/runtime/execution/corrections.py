"""The stale-weight corrections that act on the optimizer's step: ``nesterov`` and ``pipemare``.

A rank feature (:mod:`.features`): right before each update ``U@v`` of a stage it sets the
step's hyper-parameters of that stage's optimizer, and right after the step it puts back what
the user configured, so a checkpoint, a learning-rate change or a resume sees the optimizer
as built. The formulas are :mod:`pipeweave.schedules.corrections`' (docs/semantics.md):

* ``nesterov=G``: ``torch.optim.SGD`` steps as Nesterov (``nesterov=True``) with momentum
  ``u_s = u + τ_s (G - u) / (τ_max + 1)``, ``u`` the configured momentum; ``NAdam`` (a
  Nesterov step already) with its ``beta1`` raised the same way.
* ``pipemare=K``: every group's ``lr`` times ``τ_s ** -(1 - min(v / K, 1))`` for update ``v``.

:func:`check_step_corrections` refuses, before launch, an optimizer a correction does not
define.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from ...ir import Action, Op, Schedule
from ...planner.plan import Plan
from ...schedules.corrections import (NESTEROV, PIPEMARE, STEP_OPTIONS, nesterov_momentum,
                                      pipemare_scale, steady_delays)
from .features import RankFeature

if TYPE_CHECKING:
    from .interpreter import RankInterpreter

__all__ = ["StepCorrections", "step_corrections", "check_step_corrections"]

_SET = ("lr", "momentum", "nesterov", "betas")
"""The group settings a correction may change for one step (and puts back after it)."""


class StepCorrections(RankFeature):
    """Sets each update's ``momentum``/``nesterov``/``lr`` per the schedule's options."""

    def __init__(self, schedule: Schedule, delays: Mapping[int, int]) -> None:
        self.delays = dict(delays)
        self.deepest = max(self.delays.values(), default=0)
        # checked by the generator (check_corrections): a number in (0, 1), an integer >= 1
        self.top = cast("float | None", schedule.options.get(NESTEROV))
        self.anneal = cast("int | None", schedule.options.get(PIPEMARE))
        self._saved: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def before(self, interpreter: RankInterpreter, position: int, action: Action) -> None:
        if action.op is not Op.STEP:
            return
        optimizer = interpreter.parts.pipeline(action.pipeline).optimizers[action.stage]
        delay = self.delays.get(action.stage, 0)
        self._saved = []
        for group in optimizer.param_groups:
            saved: dict[str, Any] = {key: group[key] for key in _SET if key in group}
            self._saved.append((group, saved))
            if self.top is not None:
                self._nesterov(group, delay, self.top)
            if self.anneal is not None:
                assert action.version is not None
                group["lr"] = group["lr"] * pipemare_scale(delay, action.version, self.anneal)

    def _nesterov(self, group: dict[str, Any], delay: int, top: float) -> None:
        """SGD: a Nesterov step with the raised momentum; NAdam (Nesterov already): its
        ``beta1`` raised the same way."""
        if "betas" in group:
            beta1, beta2 = group["betas"]
            group["betas"] = (nesterov_momentum(beta1, delay, self.deepest, top), beta2)
        else:
            group["momentum"] = nesterov_momentum(group["momentum"], delay, self.deepest, top)
            group["nesterov"] = True

    def after(self, interpreter: RankInterpreter, position: int, action: Action) -> None:
        if action.op is not Op.STEP:
            return
        for group, saved in self._saved:
            group.update(saved)
        self._saved = []


def step_corrections(schedule: Schedule, plan: Plan) -> StepCorrections | None:
    """The feature for ``schedule``'s options (``plan``'s schedule, whose steady-state delays
    it uses), or None when it has none of them."""
    if not any(name in schedule.options for name in STEP_OPTIONS):
        return None
    return StepCorrections(schedule, steady_delays(plan.schedule, plan.shape(1)))


def check_step_corrections(schedule: Schedule,
                           optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
                           ) -> None:
    """ValueError naming the fix when ``nesterov`` meets an optimizer it is not defined for
    (``pipemare`` scales ``lr``, which every ``torch.optim`` optimizer has)."""
    if NESTEROV not in schedule.options:
        return
    built = optimizer([nn.Parameter(torch.zeros(1))])
    groups: Sequence[Mapping[str, Any]] = built.param_groups
    if type(built) is torch.optim.NAdam:
        return
    if type(built) is not torch.optim.SGD or any(g["momentum"] <= 0 or g["dampening"]
                                                 for g in groups):
        raise ValueError(
            f"option nesterov={schedule.options[NESTEROV]!r} makes every step a Nesterov step "
            f"with the momentum raised by the delay and needs torch.optim.SGD with momentum > 0 "
            f"and no dampening, or NAdam; got {type(built).__name__}; use --optimizer sgd "
            f"--momentum 0.9, or --optimizer nadam, or drop the option")
