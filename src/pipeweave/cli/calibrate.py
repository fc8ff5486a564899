"""Complete a freshly measured profile with what this machine's runs add to the blocks' times:
the link between two local ranks, the runtime's fixed costs per action
(:mod:`pipeweave.profiler.runtime_costs`) and the latency a message between rank processes
really has, so that the simulator predicts what ``pipeweave train`` will measure here, not
only the blocks' compute.

The last is fitted from one real run (:func:`fit_message_latency`): the default plan (1F1B,
uniform split over the ranks, M = 2 x ranks) is trained on local processes for a second or so
of timed iterations (:func:`timed_steps`) and
``message_latency`` is the extra latency per transfer at which its simulated iteration equals
the measured one (by bisection: the simulated time does not decrease as every transfer gets
slower). Messages are what a distributed run has that the single-process runs behind the
per-action costs do not (a rank waking up for a message, the send thread, gloo's threads), so
the rest of the gap is put on them; a run faster than predicted leaves it at 0 (the blocks'
times then already over-count). One parameter from one run: it also absorbs whatever load the
machine had at the time."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ..auto import AutoProblem
from ..auto.search import default_prediction
from ..profiler import Profile
from ..profiler.runtime_costs import RuntimeCosts

__all__ = ["calibrate", "calibration_skipped", "fit_message_latency", "MessageFit",
           "timed_steps"]


def calibration_skipped(device: str, precision: str) -> str | None:
    """Why the runtime costs cannot be measured for this profile, or ``None``."""
    if device != "cpu":
        return (f"runtime costs are measured on CPU only (the single-process executor); "
                f"the {device} profile keeps its blocks' times")
    if precision != "full":
        return (f"runtime costs are measured in full precision only; the --precision "
                f"{precision} profile keeps its blocks' times")
    return None


def calibrate(profile: Profile, model: str, overrides: dict[str, Any] | None = None, *,
              device: str = "cpu", precision: str = "full", seq_len: int | None = None,
              link: bool = True, runtime: bool = True,
              say: Callable[[str], None] | None = None) -> Profile:
    """``profile`` (of ``model``) with the measured link (``link``, when it has none) and
    runtime costs (``runtime``, when it has none and :func:`calibration_skipped` allows)."""
    if link and profile.link is None:
        from ..profiler.link import measure_link

        if device == "cpu":
            profile = profile.with_link(measure_link(device=device))
    if runtime and profile.runtime is None and calibration_skipped(device, precision) is None:
        from ..runtime.calibration import measure_runtime_costs

        costs = measure_runtime_costs(model, profile, overrides=overrides, seq_len=seq_len,
                                      say=say)
        profile = replace(profile, runtime=costs)
    return profile


@dataclass(frozen=True)
class MessageFit:
    """What :func:`fit_message_latency` measured and fitted (seconds)."""

    measured: float
    predicted_before: float
    message_latency: float

    def to_json(self) -> dict[str, float]:
        return {"measured_default_iteration_time": self.measured,
                "predicted_before": self.predicted_before,
                "message_latency": self.message_latency}


TIMED_SECONDS = 1.0
"""How long the timed iterations of a calibration run last at least: a median of a handful of
10-millisecond iterations (cnn) moves by half from one run to the next."""


def timed_steps(predicted: float, *, least: int = 6, most: int = 200) -> int:
    """Steps for a run whose iterations (the first is warm-up) last about ``TIMED_SECONDS``
    together, given a predicted iteration time."""
    wanted = math.ceil(TIMED_SECONDS / predicted) + 1 if predicted > 0 else least
    return max(least, min(most, wanted))


def _with_latency(profile: Profile, latency: float) -> Profile:
    runtime = profile.runtime if profile.runtime is not None else RuntimeCosts()
    return replace(profile, runtime=replace(runtime, message_latency=latency))


def fit_message_latency(problem: AutoProblem, model: str,
                        overrides: dict[str, Any] | None = None, *, steps: int | None = None,
                        timeout_s: float = 120.0,
                        measure: Callable[..., float] | None = None
                        ) -> tuple[AutoProblem, MessageFit | None]:
    """``problem`` with its profile's ``message_latency`` fitted to one real run of the
    default plan (module docstring); ``None`` when the default plan cannot be built.
    ``measure(plan, batch_size)`` -> seconds per iteration replaces the real run (tests)."""
    before = default_prediction(replace(problem, profile=_with_latency(problem.profile, 0.0)))
    if before is None:
        return problem, None
    if measure is None:
        from .auto_run import measure_plan

        if steps is None:
            steps = timed_steps(before.iteration_time)
        measured = measure_plan(model, before.plan, batch_size=problem.batch, steps=steps,
                                overrides=overrides, timeout_s=timeout_s,
                                memory=False).iteration_time
    else:
        measured = measure(before.plan, problem.batch)

    def predicted(latency: float) -> float:
        found = default_prediction(replace(problem, profile=_with_latency(problem.profile,
                                                                          latency)))
        assert found is not None
        return found.iteration_time

    latency = 0.0
    if before.iteration_time < measured:
        low, high = 0.0, 1e-3
        reached = predicted(high) >= measured
        while not reached and high < 60.0:
            low, high = high, high * 4
            reached = predicted(high) >= measured
        if reached:  # else no message is on the default plan's critical path: 0
            for _ in range(40):
                middle = (low + high) / 2
                low, high = (middle, high) if predicted(middle) < measured else (low, middle)
            latency = high
    fit = MessageFit(measured=measured, predicted_before=before.iteration_time,
                     message_latency=latency)
    return replace(problem, profile=_with_latency(problem.profile, latency)), fit
