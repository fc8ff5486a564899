"""Pilots for ``pipeweave auto --semantics any``: each finalist trained for a few steps in one
process on the same sample stream, and the finalists ranked by predicted time to a target loss
(:mod:`pipeweave.auto.time_to_loss`).

A pilot is the plan's own :class:`~pipeweave.runtime.Job` (the built-in model and its dataset,
seed 0: the same initial weights and the same batches for every plan), run with the
single-process executor, which gives the numbers the distributed run gives
(docs/architecture.md); its per-iteration training losses are the curve. 1F1B's pilot is the
default plan's. An exact plan (same updates as 1F1B) runs none: it takes 1F1B's slope.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..auto import Prediction, SearchResult
from ..auto.time_to_loss import PilotCurve, TimeToLossRanking, rank_by_time_to_loss
from ..runtime import Plan, iteration_losses, run_local
from .plan_run import plan_job

__all__ = ["check_pilot", "pilot_plan", "pilot_finalists"]


def check_pilot(*, steps: int, target_loss: float | None) -> None:
    """Refuse, in one line, a pilot too short for a slope or a target that is no loss."""
    if steps < 2:
        raise ValueError(f"--steps {steps} is too few for a pilot's loss per sample: a line "
                         f"needs two iterations; use --steps 2 or more")
    if target_loss is not None and not target_loss == target_loss:  # NaN
        raise ValueError("--target-loss nan is no loss; pass a number, e.g. --target-loss 3.0")


def pilot_plan(plan: Plan, *, model: str, batch_size: int, steps: int, apc: bool = False,
               optimizer: str = "adam", lr: float = 1e-3,
               overrides: Mapping[str, Any] | None = None) -> PilotCurve:
    """``plan`` trained for ``steps`` iterations of ``batch_size`` samples (per pipeline) in
    this process; a run that stops at a non-finite loss is a curve ending in ``inf``."""
    job = plan_job(plan, model=model, batch_size=batch_size, steps=steps, apc=apc,
                   optimizer=optimizer, lr=lr, overrides=overrides)
    samples = batch_size * plan.pipelines
    try:
        results = run_local(job)
    except FloatingPointError:  # the runtime stops at the first non-finite loss
        return PilotCurve((float("inf"),) * steps, samples)
    return PilotCurve(tuple(iteration_losses(results, plan.microbatches)), samples)


def pilot_finalists(result: SearchResult, *, model: str, steps: int, top: int,
                    target: float | None, optimizer: str = "adam", lr: float = 1e-3,
                    overrides: Mapping[str, Any] | None = None,
                    progress: Callable[[str], None] | None = None) -> TimeToLossRanking:
    """The first ``top`` ranked predictions, piloted (all but exact ones) against the default
    plan (1F1B), ranked by predicted seconds to ``target`` (None: 1F1B's loss after
    ``steps``)."""
    if result.default is None or result.default.candidate.training() != "exact":
        raise ValueError("ranking by time to loss needs the default plan (1F1B, exact) as the "
                         "baseline, and this search has none; check --ranks and --schedules")
    batch = result.problem.batch

    def pilot(prediction: Prediction) -> PilotCurve:
        if progress is not None:
            progress(f"pilot: {prediction.plan.schedule}, {steps} steps in one process ...")
        return pilot_plan(prediction.plan, model=model, batch_size=batch, steps=steps,
                          apc=prediction.candidate.apc, optimizer=optimizer, lr=lr,
                          overrides=overrides)

    baseline = pilot(result.default)
    finalists = [(p, None if p.candidate.training() == "exact" else pilot(p))
                 for p in result.ranked[:top]]
    return rank_by_time_to_loss(finalists, baseline=baseline, target=target)
