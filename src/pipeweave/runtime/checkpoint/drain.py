"""Checkpoints of the asynchronous schedules (and zb-h2's post-validation): at drains, which
``--checkpoint-every`` puts there.

An asynchronous schedule (``pipedream``, ``2bw``, ``pipeoptim``, ``spectrain``, ``wpipe``) has
a clean boundary only where it drains (option ``drain=N``,
:mod:`pipeweave.schedules.async_common`): every in-flight micro-batch has finished and every
update has landed, so a rank's state there is its parameters and optimizer state, as on a
flush schedule. ``zb-h2`` with ``post_validation`` likewise: its ``drain=N`` checks every
``N``-th update before it, so that update is final before the next step starts. :func:`with_drain` gives such a job the drain its checkpoints need;
:func:`check_drained` refuses checkpoint steps that are not drains, and prediction rules whose
state is more than the optimizer's. See docs/checkpoints.md and docs/semantics.md.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from ...ir import Schedule
from ...schedules import get_info
from ...schedules.async_common import DRAIN
from ..execution.prediction import keeps_state
from ..job import Job
from .resume import resume_folder

__all__ = ["with_drain", "check_drained", "check_prediction", "drain_of"]


def drain_of(job: Job) -> int | None:
    """The drain interval ``job``'s plan sets (None: no drain)."""
    value = job.plan.schedule_options.get(DRAIN)
    return value if isinstance(value, int) else None


def with_drain(job: Job) -> Job:
    """``job`` with ``drain=N`` on an asynchronous schedule that writes or resumes checkpoints
    and sets no drain itself: ``N`` = ``--checkpoint-every``, or, when only resuming, the
    drain the checkpoint was written with (so the run goes on as the uninterrupted one)."""
    options = job.checkpoint
    if options is None or (options.directory is None and options.resume is None):
        return job
    info = get_info(job.plan.schedule)
    if DRAIN not in info.options or DRAIN in job.plan.schedule_options:
        return job
    every = options.every or _saved_drain(resume_folder(options))
    if not every:
        return job
    plan = replace(job.plan, schedule_options={**job.plan.schedule_options, DRAIN: every})
    return replace(job, plan=plan)


def _saved_drain(folder: str | None) -> int | None:
    if folder is None:
        return None
    try:
        manifest = json.loads((Path(folder) / "MANIFEST.json").read_text())
        value = manifest["plan"].get("schedule_options", {}).get(DRAIN)
    except (OSError, ValueError, KeyError, AttributeError):
        return None  # a damaged checkpoint: refused with its reason when it is opened
    return value if isinstance(value, int) else None


def check_drained(job: Job, schedule: Schedule, steps: list[int]) -> None:
    """Refuse checkpoint steps (1-based) that are not drains of ``schedule``, and a prediction
    whose direction needs state a checkpoint does not hold."""
    if not steps:
        return
    every = drain_of(job)
    if every is None:
        raise ValueError(
            f"a checkpoint after step {steps[0]} needs a drain there, and {schedule.name!r} "
            f"overlaps its steps and drains only at the end of the run; give --checkpoint-every N "
            f"(it drains every N steps) or --option drain=N with steps that are multiples of N")
    raise ValueError(
        f"a checkpoint after step {steps[0]} needs a drain there, but {schedule.name!r} drains "
        f"every {every} steps (option drain={every}); checkpoint at multiples of {every}, or "
        f"set --option drain to a divisor of {steps[0]}")


def check_prediction(job: Job, schedule: Schedule) -> None:
    """PipeOptim's direction must come from the optimizer state alone to be checkpointed."""
    if not any(a.lookahead for program in schedule.programs for a in program):
        return
    rule = get_info(schedule.name).prediction or "optimizer"  # the entry's prediction mode
    optimizer = job.optimizer([nn.Parameter(torch.zeros(1))])
    if keeps_state(optimizer, rule):
        raise ValueError(
            f"checkpoint/resume of {schedule.name!r} with {type(optimizer).__name__} "
            f"{_flags(optimizer)} is not supported: its predicted direction needs the last "
            f"effective gradient or the previous weights, which a checkpoint does not hold; use "
            f"SGD with plain momentum, Adam or AdamW, or run without checkpoints")


def _flags(optimizer: torch.optim.Optimizer) -> str:
    group = optimizer.param_groups[0]
    keys = ("momentum", "nesterov")
    return "(" + ", ".join(f"{k}={group[k]}" for k in keys if k in group) + ")"
