"""The latency a message between rank processes really has, fitted from one real run.

``pipeweave auto`` now fits it together with the all-reduce's fixed cost from alternating
runs of the default and a data-parallel plan (:mod:`.calibration_runs`, which reuses
:func:`_bisect` and :func:`timed_steps`); this one-plan fit stays for callers that time the
default plan alone.

The default plan (1F1B, uniform split over the ranks, M = 2 x ranks) is trained on local
processes for a second or so of timed iterations (:func:`timed_steps`) and
``message_latency`` is the extra latency per transfer at which its simulated iteration equals
the measured one (by bisection: the simulated time does not decrease as every transfer gets
slower). Messages are what a distributed run has that the single-process runs behind the
per-action costs do not (a rank waking up for a message, the send thread, gloo's threads), so
the rest of the gap is put on them; a run faster than predicted leaves it at 0 (the blocks'
times then already over-count). One parameter from one run: it also absorbs whatever load the
machine had at the time.

The bisection asks for the default plan's simulated time some 50 times. The plan is
partitioned (and its memory predicted) once, by :func:`pipeweave.auto.search.default_prediction`;
each probe then only re-prices the plan's costs at that latency and simulates it
(:func:`default_plan_time`), which gives the same number as a whole prediction (the latency
moves neither the uniform split, nor the micro-batch size, nor the options of 1F1B).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..auto import AutoProblem, Prediction
from ..auto.predict import simulate_candidate
from ..auto.scaling import scaled_profile
from ..auto.search import default_prediction
from ..planner.plan import Plan
from ..profiler import Profile
from ..profiler.runtime_costs import RuntimeCosts

__all__ = ["MessageFit", "TIMED_SECONDS", "default_plan_time", "fit_message_latency",
           "timed_steps", "with_message_latency"]


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


def timed_steps(predicted: float, *, least: int = 6, most: int = 200,
                seconds: float = TIMED_SECONDS) -> int:
    """Steps for a run whose iterations (the first is warm-up) last about ``seconds``
    (``TIMED_SECONDS``) together, given a predicted iteration time."""
    wanted = math.ceil(seconds / predicted) + 1 if predicted > 0 else least
    return max(least, min(most, wanted))


def with_message_latency(profile: Profile, *, latency: float) -> Profile:
    """``profile`` whose runtime costs have ``message_latency`` = ``latency`` seconds."""
    runtime = profile.runtime if profile.runtime is not None else RuntimeCosts()
    return replace(profile, runtime=replace(runtime, message_latency=latency))


def default_plan_time(problem: AutoProblem
                      ) -> tuple[Prediction, Callable[[float], float]] | None:
    """The default plan predicted at message latency 0, and ``latency -> its simulated
    iteration time`` (module docstring); ``None`` when the default plan cannot be built."""
    plain = replace(problem, profile=with_message_latency(problem.profile, latency=0.0))
    before = default_prediction(plain)
    if before is None:
        return None
    size = problem.batch // before.candidate.microbatches
    scaled = scaled_profile(plain.profile, size, problem.extra_profiles)

    def iteration_time(latency: float) -> float:
        profile = with_message_latency(scaled, latency=latency)
        return simulate_candidate(before.candidate, profile, plain).iteration_time

    return before, iteration_time


def _bisect(predicted: Callable[[float], float], measured: float) -> float:
    """The least latency (to 40 halvings) at which ``predicted`` reaches ``measured``; 0 when
    no latency up to a minute does (no message on the critical path)."""
    low, high = 0.0, 1e-3
    reached = predicted(high) >= measured
    while not reached and high < 60.0:
        low, high = high, high * 4
        reached = predicted(high) >= measured
    if not reached:
        return 0.0
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if predicted(middle) < measured else (low, middle)
    return high


def fit_message_latency(problem: AutoProblem, *, model: str,
                        overrides: Mapping[str, Any] | None = None, steps: int | None = None,
                        timeout_s: float = 120.0,
                        measure: Callable[[Plan, int], float] | None = None
                        ) -> tuple[AutoProblem, MessageFit | None]:
    """``problem`` with its profile's ``message_latency`` fitted to one real run of the
    default plan (module docstring) of ``model``; ``None`` when the default plan cannot be
    built. ``measure(plan, batch_size)`` -> seconds per iteration replaces the real run."""
    found = default_plan_time(problem)
    if found is None:
        return problem, None
    before, predicted = found
    if measure is None:
        from .plan_run import measure_plan

        if steps is None:
            steps = timed_steps(before.iteration_time)
        measured = measure_plan(before.plan, model=model, batch_size=problem.batch,
                                steps=steps, overrides=overrides, timeout_s=timeout_s,
                                memory=False).iteration_time
    else:
        measured = measure(before.plan, problem.batch)
    latency = _bisect(predicted, measured) if before.iteration_time < measured else 0.0
    fit = MessageFit(measured=measured, predicted_before=before.iteration_time,
                     message_latency=latency)
    return replace(problem, profile=with_message_latency(problem.profile, latency=latency)), fit
