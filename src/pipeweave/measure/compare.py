"""``pipeweave auto --run``: the winner and the default plan trained in alternating rounds
(:mod:`.alternating`) and compared with what was predicted.

Each plan's measured iteration time is the median of its rounds (each round a fresh run of
about ``seconds`` of timed iterations, or ``steps`` steps, the warm-up iteration left out);
its peak memory per rank comes from one more short run with the allocations tracked
(:func:`.plan_run.peak_memory`). Per plan the report gives the rounds, their spread, the
median, and the relative error of the predicted iteration time against that median; and, to
tell a compute the profile mispriced from waits the model missed, each round's compute (the
seconds of F, B, I and W actions per iteration on the timelines, summed over ranks) and the
busy fraction (that compute over ranks x the iteration, median of the rounds) beside the
predicted one (1 - the simulated bubble fraction).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..auto import Prediction
from ..planner.plan import Plan
from .alternating import RUN_ROUNDS, TIMED_SECONDS, Rounds, TimedRounds, Timer, time_rounds
from .plan_run import peak_memory, plan_timer

__all__ = ["compare_predictions", "measure_alongside", "measure_predictions"]

def compare_predictions(predictions: Mapping[str, Prediction], *,
                        rounds: Mapping[str, Rounds], memory: Mapping[str, list[int]],
                        batch_size: int, compute: Mapping[str, Sequence[float]] | None = None,
                        ranks: Mapping[str, int] | None = None) -> dict[str, dict[str, Any]]:
    """Per label: the measured rounds beside the prediction (module docstring);
    ``compute``: per label, per round, the measured compute seconds summed over its
    ``ranks[label]`` ranks (default: the plan's processes)."""
    out: dict[str, dict[str, Any]] = {}
    for label, prediction in predictions.items():
        done = rounds[label]
        samples = batch_size * prediction.plan.pipelines
        count = (ranks or {}).get(label, prediction.plan.processes)
        out[label] = {**done.to_json(), **_busy(prediction, done, (compute or {}).get(label),
                                                count),
                      "iteration_time": done.median,
                      "samples_per_second": samples / done.median,
                      "peak_memory_bytes": list(memory.get(label, [])),
                      "predicted_iteration_time": prediction.iteration_time,
                      "predicted_peak_memory_bytes": list(prediction.peak_memory_bytes),
                      "iteration_time_error": abs(prediction.iteration_time - done.median)
                      / done.median}
    return out


def _busy(prediction: Prediction, done: Rounds,
          compute: Sequence[float] | None, ranks: int) -> dict[str, Any]:
    """The measured compute per round and busy fraction beside the predicted one (none
    without the compute of every round)."""
    if compute is None or len(compute) != len(done.times) or ranks < 1:
        return {}
    busy = statistics.median(c / (ranks * t) for c, t in zip(compute, done.times) if t > 0)
    return {"compute_seconds": list(compute), "busy_fraction": busy,
            "predicted_busy_fraction": 1.0 - prediction.bubble_fraction}


def measure_predictions(predictions: Mapping[str, Prediction], *, model: str, batch_size: int,
                        rounds: int = RUN_ROUNDS, seconds: float = TIMED_SECONDS,
                        steps: int | None = None, optimizer: str = "adam",
                        timeout_s: float = 120.0, overrides: Mapping[str, Any] | None = None,
                        say: Callable[[str], None] | None = None) -> dict[str, dict[str, Any]]:
    """Train each of ``predictions`` (label -> prediction) in alternating rounds, track its
    memory once, and compare (:func:`compare_predictions`)."""
    return measure_alongside(predictions, model=model, batch_size=batch_size, rounds=rounds,
                             seconds=seconds, steps=steps, optimizer=optimizer,
                             timeout_s=timeout_s, overrides=overrides, say=say)[0]


def measure_alongside(predictions: Mapping[str, Prediction], *, model: str, batch_size: int,
                      rounds: int = RUN_ROUNDS, seconds: float = TIMED_SECONDS,
                      steps: int | None = None, optimizer: str = "adam",
                      timeout_s: float = 120.0, overrides: Mapping[str, Any] | None = None,
                      say: Callable[[str], None] | None = None,
                      beside: Mapping[str, tuple[Plan, float]] | None = None,
                      beside_timer: Timer | None = None
                      ) -> tuple[dict[str, dict[str, Any]], TimedRounds]:
    """:func:`measure_predictions`, with the ``beside`` plans (label -> plan and predicted
    seconds per iteration; e.g. the calibration's, :mod:`.calibration_retime`) timed in the
    same alternating rounds through ``beside_timer``: the comparison, and the ``beside``
    plans' rounds (no memory run for them)."""
    timer = plan_timer(model=model, batch_size=batch_size, optimizer=optimizer,
                       timeout_s=timeout_s, overrides=overrides,
                       apc={label: p.candidate.apc for label, p in predictions.items()})
    others = dict(beside or {})
    if others and beside_timer is None:
        raise ValueError("plans timed beside the predictions need their timer (beside_timer)")
    clash = sorted(set(others) & set(predictions))
    if clash:
        raise ValueError(f"labels {clash} are both predictions and plans beside them; "
                         "give the plans beside them other labels")
    timers = {**{label: timer for label in predictions},
              **{label: beside_timer for label in others if beside_timer is not None}}
    plans = {**{label: (p.plan, p.iteration_time) for label, p in predictions.items()}, **others}
    timed = time_rounds(plans, timers, rounds=rounds, seconds=seconds, steps=steps, say=say)
    memory = {label: peak_memory(p.plan, model=model, batch_size=batch_size,
                                 apc=p.candidate.apc, optimizer=optimizer, timeout_s=timeout_s,
                                 overrides=overrides)
              for label, p in predictions.items()}
    compared = compare_predictions(predictions, rounds=timed.rounds, memory=memory,
                                   batch_size=batch_size, compute=timed.compute,
                                   ranks=timed.ranks)
    return compared, TimedRounds({label: timed.rounds[label] for label in others},
                                 {label: timed.compute[label] for label in others},
                                 {label: timed.ranks[label] for label in others})
