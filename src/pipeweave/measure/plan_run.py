"""Train a plan for a few steps on local processes and measure it (``pipeweave auto --run``,
the message-latency fit, ``benchmarks/auto.py``).

The same path as ``pipeweave train --plan FILE`` (a :class:`~pipeweave.runtime.Job` of the
built-in model and its dataset, launched with ``launch_local``: one process per rank, gloo over
loopback). Measured iteration time: the median gap between consecutive iteration ends on the
runtime's own timeline, the first iteration (warm-up) left out, as
``benchmarks/simulator_fidelity.py`` measures it. Measured peak memory: a second, short run
with ``Job.track_allocations`` (the most bytes of live tensors per rank at the allocator, what
the memory model predicts, docs/memory.md; tracking slows a CPU run, so it is not timed). The
process's peak RSS (interpreter and libraries included) is reported beside it.
"""

from __future__ import annotations

import os
import re
import statistics
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from ..auto import Prediction
from ..runtime import BuiltinModel, Job, OptimizerFactory, Plan, launch_local
from ..runtime.observation.results import RankResult
from ..runtime.observation.summary import summarize
from ..schedules import get_info

__all__ = ["Measured", "plan_job", "measure_plan", "measure_prediction", "check_steps",
           "plan_timer", "peak_memory", "compute_per_iteration"]


@contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Send what the rank processes print (torch's profiler notes) to stderr, so that stdout
    keeps only the command's own output (``--json``: one object)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


@dataclass(frozen=True)
class Measured:
    """One run of a plan."""

    iteration_time: float
    peak_memory_bytes: list[int]
    """Per rank: most bytes of live tensors (``RankResult.peak_allocated_bytes``)."""
    samples_per_second: float
    peak_rss_bytes: list[int]
    compute_seconds: list[float] = field(default_factory=list)
    """Per rank: seconds of compute actions (F, B, I, W) per timed iteration, from its
    timeline (:func:`compute_per_iteration`)."""

    def to_json(self) -> dict[str, Any]:
        return {"iteration_time": self.iteration_time,
                "peak_memory_bytes": list(self.peak_memory_bytes),
                "samples_per_second": self.samples_per_second,
                "peak_rss_bytes": list(self.peak_rss_bytes),
                "compute_seconds": list(self.compute_seconds)}


def check_steps(steps: int) -> None:
    """Refuse a run too short to time (ValueError naming ``--steps``)."""
    if steps < 3:
        raise ValueError(f"--steps {steps} is too few to time: the first iteration is warm-up "
                         f"and the time is a gap between two later ones; use --steps 3 or more")


def plan_job(plan: Plan, *, model: str, batch_size: int, steps: int, apc: bool = False,
             optimizer: str = "adam", lr: float = 1e-3, seed: int = 0, timeout_s: float = 120.0,
             overrides: Mapping[str, Any] | None = None) -> Job:
    """The job ``pipeweave train --plan`` runs for ``plan``: the built-in ``model`` and its
    dataset at ``batch_size`` samples (seed ``seed``), ``optimizer`` at ``lr`` (or the
    schedule's own optimizer where it names one)."""
    builtin = BuiltinModel(model, seed=seed, overrides=dict(overrides or {}))
    default = get_info(plan.schedule).default_optimizer
    name, kwargs = (default[0], dict(default[1])) if default is not None else (optimizer, {})
    return Job(plan=plan, steps=steps, model=builtin, data=builtin.data(batch_size, seed=seed),
               optimizer=OptimizerFactory(name, {"lr": lr, **kwargs}), seed=seed,
               timeout_s=timeout_s, progress=False, apc=apc)


def measure_plan(plan: Plan, *, model: str, batch_size: int, steps: int, apc: bool = False,
                 optimizer: str = "adam", seed: int = 0, timeout_s: float = 120.0,
                 overrides: Mapping[str, Any] | None = None, memory: bool = True) -> Measured:
    """Train ``plan`` of the built-in ``model`` for ``steps`` iterations of ``batch_size``
    samples and measure it (``memory`` False: time only, no second run;
    ``peak_memory_bytes`` is then empty)."""
    check_steps(steps)
    job = plan_job(plan, model=model, batch_size=batch_size, steps=steps, apc=apc,
                   optimizer=optimizer, seed=seed, timeout_s=timeout_s, overrides=overrides)
    with _stdout_to_stderr():
        results = launch_local(job, deadline_s=timeout_s * 4)
        tracked = _tracked(job, timeout_s) if memory else []
    summary = summarize(results, schedule=plan.schedule, steps=steps, batch_size=batch_size,
                        microbatches=plan.microbatches, pipelines=plan.pipelines)
    ends = summary.iteration_end_s
    gaps = [b - a for a, b in zip(ends, ends[1:])][1:]
    return Measured(iteration_time=statistics.median(gaps),
                    peak_memory_bytes=[r.peak_allocated_bytes for r in tracked],
                    samples_per_second=summary.samples_per_second,
                    peak_rss_bytes=list(summary.peak_memory_bytes),
                    compute_seconds=compute_per_iteration(results, ends))


_COMPUTE = re.compile(r"^\d+[FBIW]\d")
"""A compute action's text (``2F0``, ``1W3``): stage, op, micro-batch."""


def compute_per_iteration(results: Sequence[RankResult], ends: Sequence[float]) -> list[float]:
    """Per rank, seconds of its compute actions per iteration between the first and the last
    iteration end (the warm-up iteration left out)."""
    if len(ends) < 2:
        return [0.0 for _ in results]
    low, high, count = ends[0], ends[-1], len(ends) - 1
    return [sum(end - start for _rank, text, start, end in result.records
                if start >= low and end <= high and _COMPUTE.match(text)) / count
            for result in results]


def plan_timer(*, model: str, batch_size: int, optimizer: str = "adam", timeout_s: float = 120.0,
               overrides: Mapping[str, Any] | None = None,
               apc: Mapping[str, bool] | None = None
               ) -> Callable[[str, Plan, int], tuple[float, list[float]]]:
    """``(label, plan, steps) -> (seconds per iteration, per rank compute seconds per
    iteration)`` of one timed run of ``plan`` (no memory run), with APC where ``apc[label]``
    says so: the runner of the calibration
    (:func:`pipeweave.measure.calibration_runs.fit_calibration`) and of ``auto --run``
    (:func:`pipeweave.measure.compare.measure_predictions`)."""
    compressed = dict(apc or {})

    def time_one(label: str, plan: Plan, steps: int) -> tuple[float, list[float]]:
        done = measure_plan(plan, model=model, batch_size=batch_size, steps=steps,
                            apc=compressed.get(label, False), optimizer=optimizer,
                            timeout_s=timeout_s, overrides=overrides, memory=False)
        return done.iteration_time, done.compute_seconds

    return time_one


def _tracked(job: Job, timeout_s: float) -> list[RankResult]:
    """A short run of ``job`` with its allocations tracked (not timed: tracking slows it)."""
    return launch_local(replace(job, steps=min(job.steps, 4), track_allocations=True),
                        deadline_s=timeout_s * 4)


def peak_memory(plan: Plan, *, model: str, batch_size: int, apc: bool = False,
                optimizer: str = "adam", timeout_s: float = 120.0,
                overrides: Mapping[str, Any] | None = None) -> list[int]:
    """Per rank, the most bytes of live tensors in a short tracked run of ``plan``
    (``Measured.peak_memory_bytes`` alone)."""
    job = plan_job(plan, model=model, batch_size=batch_size, steps=4, apc=apc,
                   optimizer=optimizer, timeout_s=timeout_s, overrides=overrides)
    with _stdout_to_stderr():
        return [r.peak_allocated_bytes for r in _tracked(job, timeout_s)]


def measure_prediction(prediction: Prediction, *, model: str, batch_size: int, steps: int,
                       optimizer: str = "adam", timeout_s: float = 120.0,
                       overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``prediction``'s plan measured (:func:`measure_plan`, with its APC setting) beside what
    was predicted, and the relative error of the predicted iteration time (``auto --run``)."""
    done = measure_plan(prediction.plan, model=model, batch_size=batch_size, steps=steps,
                        apc=prediction.candidate.apc, optimizer=optimizer, timeout_s=timeout_s,
                        overrides=overrides)
    return {**done.to_json(),
            "predicted_iteration_time": prediction.iteration_time,
            "predicted_peak_memory_bytes": list(prediction.peak_memory_bytes),
            "iteration_time_error": abs(prediction.iteration_time - done.iteration_time)
            / done.iteration_time}
