"""Rank features: what plugs into the interpreter around its actions.

The interpreter (:mod:`.interpreter`) runs the schedule's actions and nothing else; everything a
run adds around them is a :class:`RankFeature` in the list it is given: gradient clipping
(:mod:`.clipping`), tied gradients (:mod:`.ties`), zb-h2's post-validation
(:mod:`.global_check`), the activation meter and the timeline (:class:`MeterActivations`,
:class:`RecordTimeline`), ``on_step`` (:class:`OnStep`) and the hooks at positions of the
program: checkpoints, fault injection, weight snapshots (:class:`PositionHooks`).

A feature overrides only the hooks it needs; the interpreter calls a hook only on the features
that override it, so a run without features pays nothing. Every hook gets the interpreter, for
its rank, program, parts and transport::

    attach(interpreter)                  once, when the interpreter is built: may refuse it,
                                         and returns the ops the feature runs (e.g. C and V)
    before(interpreter, position, a)     before the action at ``position``, in list order
    after(interpreter, position, a)      after it (``executed`` already counts it), list order
    allows_step(interpreter, a)          inside ``U``, before the optimizer steps: False skips it
    observe_forward(interpreter, key, module, inputs)   a context around a forward
    released(interpreter, a)             a forward's activations were let go (its B or W, a redo)

``before`` and ``after`` may return a generator: the interpreter runs it with ``yield from``, so
a feature that waits for other ranks (an all-reduce) yields in the single-process executor as an
action does. To add a feature, subclass :class:`RankFeature` and pass it to
:func:`pipeweave.runtime.run_local` (``features=``) or :func:`..launch.assemble.assemble_rank`.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from ...ir import Action, Op
from ..observation.memory import ActivationMeter
from ..observation.timeline import Mark, Recorder

if TYPE_CHECKING:
    from .interpreter import RankInterpreter
    from .stage import StageRuntime

__all__ = ["RankFeature", "Steps", "Handler", "overriding", "PositionHooks", "OnStep",
           "RecordTimeline", "MeterActivations"]

Steps = Generator[None, None, Any]
"""What a hook or handler that waits for other ranks returns: run with ``yield from``."""
Handler = Callable[[Action, int], "Steps | None"]
"""Runs one action (``action, position``); a generator when it waits. A handler's generator may
return the position to run again from (post-validation's redo), else None."""


class RankFeature:
    """A feature of a rank's run; every hook does nothing unless overridden (module docstring)."""

    def attach(self, interpreter: RankInterpreter) -> Mapping[Op, Handler]:
        """Called once by the interpreter this feature joins; the ops it runs (none)."""
        return {}

    def before(self, interpreter: RankInterpreter, position: int, action: Action) -> Steps | None:
        return None

    def after(self, interpreter: RankInterpreter, position: int, action: Action) -> Steps | None:
        return None

    def allows_step(self, interpreter: RankInterpreter, action: Action) -> bool:
        return True

    def observe_forward(self, interpreter: RankInterpreter, key: tuple[int, int, int, int],
                        module: nn.Module,
                        inputs: Tensor) -> AbstractContextManager[list[Tensor]] | None:
        """A context the forward runs in; the forward's output is appended to its list."""
        return None

    def released(self, interpreter: RankInterpreter, action: Action) -> None:
        return None


def overriding(features: list[RankFeature], hook: str) -> list[RankFeature]:
    """The features whose class overrides ``hook`` (the only ones the interpreter calls)."""
    default = getattr(RankFeature, hook)
    return [f for f in features if getattr(type(f), hook) is not default]


class PositionHooks(RankFeature):
    """``position -> callable`` run right after that action (checkpoint writes, fault
    injection, weight snapshots: :func:`..checkpoint.boundaries.combine_hooks`)."""

    def __init__(self, hooks: Mapping[int, Callable[[], None]]) -> None:
        self.hooks = dict(hooks)

    def after(self, interpreter: RankInterpreter, position: int, action: Action) -> None:
        hook = self.hooks.get(position)
        if hook is not None:
            hook()


class OnStep(RankFeature):
    """``hook(action, stages)`` after every update of pipeline 0 (progress bar, journal)."""

    def __init__(self, hook: Callable[[Action, Mapping[int, StageRuntime]], None]) -> None:
        self.hook = hook

    def after(self, interpreter: RankInterpreter, position: int, action: Action) -> None:
        if action.op is Op.STEP and action.pipeline == 0:
            self.hook(action, interpreter.stages)


class RecordTimeline(RankFeature):
    """Each action's start and end on ``recorder`` (:mod:`..observation.timeline`); put it
    first in the list, so that what other features do before an action counts as its time."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self._texts: list[str] = []
        self._start: Mark = 0.0

    def attach(self, interpreter: RankInterpreter) -> Mapping[Op, Handler]:
        self._texts = [str(action) for action in interpreter.program]
        return {}

    def before(self, interpreter: RankInterpreter, position: int, action: Action) -> None:
        self._start = self.recorder.mark()

    def after(self, interpreter: RankInterpreter, position: int, action: Action) -> None:
        self.recorder.add(self._texts[position], self._start, self.recorder.mark())


class MeterActivations(RankFeature):
    """Counts the activation bytes kept between forwards and backwards on ``meter``
    (:mod:`..observation.memory`; the online advance controller's memory reading)."""

    def __init__(self, meter: ActivationMeter) -> None:
        self.meter = meter

    def observe_forward(self, interpreter: RankInterpreter, key: tuple[int, int, int, int],
                        module: nn.Module, inputs: Tensor) -> AbstractContextManager[list[Tensor]]:
        return self.meter.forward(key, module, inputs)

    def released(self, interpreter: RankInterpreter, action: Action) -> None:
        assert action.microbatch is not None
        self.meter.release(action.stage, action.microbatch, action.pipeline)
