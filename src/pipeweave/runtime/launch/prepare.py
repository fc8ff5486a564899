"""Validate once: everything about a job that can be checked before any rank starts.

:func:`prepare` checks that the job's device exists (:func:`pipeweave.devices.require_device`),
builds the run's lowered schedule, runs one sample through the stages
(shape mismatches between stages), checks that a tie split over stages can be kept exact
(:mod:`..execution.ties`), AvgPipe's online advance, whether the schedule can
checkpoint and clip gradients, and the checkpoint to resume (it fits the model, optimizer, data stream and
number of pipelines; its checksums), and decides the run's :class:`Session`. It returns a
:class:`PreparedJob`: immutable, picklable, what the executors and every rank receive, so no
rank repeats a check or rebuilds the schedule. A bad input is a ``ValueError`` (or
:class:`~..checkpoint.store.CheckpointError`) naming the value and the fix, raised here, in
the process the user started.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...devices import require_device
from ...ir import Schedule
from ...models import ModelSpec
from ...precision import check_precision
from ..advance.online import check_advance, check_advance_resume
from ..checkpoint.boundaries import check_checkpointable, check_resume_point
from ..checkpoint.drain import with_drain
from ..checkpoint.resume import Session, check_resume, new_session
from ..execution.clipping import check_clippable
from ..execution.corrections import check_step_corrections
from ..execution.parts import make_schedule, preflight
from ..execution.ties import SplitTie, split_ties
from ..checkpoint.snapshots import check_snapshots
from ..job import Job

__all__ = ["PreparedJob", "prepare", "prepared"]


@dataclass(frozen=True)
class PreparedJob:
    """A :class:`Job` that passed every check, with what the checks decided."""

    job: Job
    schedule: Schedule
    """The whole run's lowered schedule (every rank interprets its program)."""
    session: Session | None
    """The run's id and the checkpoint folder it resumes (None: no checkpoint options)."""
    first_step: int = 0
    """Steps already done (the resumed checkpoint's step; 0 for a fresh run)."""
    ties: tuple[SplitTie, ...] = ()
    """Parameters the plan splits over stages, kept one by summing their copies' gradients
    (:mod:`..execution.ties`)."""


def prepare(job: Job, *, spec: ModelSpec | None = None,
            verify_checksums: bool = True) -> PreparedJob:
    """Check ``job`` (see the module docstring); ``spec``: the model, if already built.

    ``verify_checksums``: hash every shard of the checkpoint to resume (False where another
    process does it, e.g. every torchrun rank but 0).
    """
    require_device(job.device)
    job = with_drain(job)  # an asynchronous schedule drains where it checkpoints
    schedule = make_schedule(job.plan, job.steps)
    spec = job.model() if spec is None else spec
    check_precision(job.precision, dtype=_model_dtype(spec), apc=job.apc)
    inputs, _ = next(iter(job.data()))
    preflight(spec, job.plan, inputs, precision=job.precision)
    ties = split_ties(spec, job.plan, schedule)
    if job.plan.shard != "none":
        _check_sharded(job, tied=bool(spec.tied), flag=f"--shard {job.plan.shard}")
    elif not job.prefetch_gathers:
        raise ValueError("--no-prefetch-gathers without --shard: an unsharded stage gathers "
                         "nothing; drop it or give --shard full or grad-op")
    if job.plan.tp > 1:
        _check_tensor_parallel(job, spec)
    check_advance(job, spec)
    check_checkpointable(job, schedule)
    check_step_corrections(schedule, job.optimizer)
    if job.eval_every:
        check_snapshots(schedule, pipelines=job.plan.pipelines,
                        online_advance=job.advance is not None)
    if job.clip_grad_norm is not None:
        if job.advance is not None:
            raise ValueError("--clip-grad-norm with --advance auto is not supported (the online "
                             "controller runs the schedule one iteration at a time); fix the "
                             "advance (--advance K) or drop --clip-grad-norm")
        check_clippable(schedule, job.clip_grad_norm)
    stored = check_resume(job, spec, verify=verify_checksums)
    if stored is not None:
        check_resume_point(schedule, stored.step)
        check_advance_resume(job, stored.manifest)
    session = new_session(job.checkpoint, stored) if job.checkpoint is not None else None
    return PreparedJob(job, schedule, session, stored.step if stored is not None else 0, ties)


TP_TORCH = "2.13"
"""The oldest torch tensor parallelism ran on (the whole suite); 2.11 fails in DTensor's
redistribution of ``_StridedShard`` placements, 2.12 was never tried."""


def _check_tensor_parallel(job: Job, spec: ModelSpec) -> None:
    """What tensor parallelism inside a stage (``Plan.tp``) does not cover yet (the plan's
    own refusals are :func:`pipeweave.planner.tensor_parallel.check_tp`): the model must be
    the built-in GPT with ``tp`` dividing its heads and MLP width; every option sharding
    refuses is refused too (the split parameters are DTensors as FSDP2's are)."""
    from ..execution.tensor_parallel import check_parallelizable  # DTensor only for tp

    if torch.__version__ < TP_TORCH:
        raise ValueError(f"tp={job.plan.tp} needs torch {TP_TORCH} or newer, this is torch "
                         f"{torch.__version__}: its DTensor cannot redistribute the head-split "
                         f"qkv weight (a _StridedShard; seen on 2.11, docs/gpu.md); upgrade torch "
                         f"or use tp=1")
    check_parallelizable(spec.blocks, job.plan.tp)
    _check_sharded(job, tied=bool(spec.tied), flag=f"tp={job.plan.tp}")


def _check_sharded(job: Job, *, tied: bool, flag: str) -> None:
    """What FSDP2 inside a stage (``Plan.shard``) and tensor parallelism (``Plan.tp``) do not
    cover yet: one line each, naming why and the fix (the plan's own refusals are
    :func:`pipeweave.planner.sharding.check_shard`; docs/sharding.md lists them as the next
    slices). ``flag``: the option refused."""
    none = "--shard none" if flag.startswith("--shard") else "tp=1"
    refusals = [
        (job.clip_grad_norm is not None, "with --clip-grad-norm: the global norm over split or sharded "
         "gradients is not summed yet; drop --clip-grad-norm or use " + none),
        (tied, "with tied parameters (the model's tied groups): a weight held by two blocks "
         "cannot be sharded per block yet; untie them or use " + none),
        (job.apc, "with --apc: compressed messages are not combined with sharding yet; drop "
         "--apc or use " + none),
        (job.advance is not None, "with --advance auto (AvgPipe's online controller): "
         "AvgPipe's averaging reads whole parameters; use " + none),
        (_fused(job.optimizer), "with a fused optimizer step: torch has no fused kernel for "
         "split or sharded (DTensor) parameters; use --optimizer-impl auto, foreach or loop"),
        (job.eval_every > 0, "with --eval-every: the held-out loss copies whole stage weights, "
         "not shards, yet; drop --eval-every or use " + none),
    ]
    for refused, why in refusals:
        if refused:
            raise ValueError(f"{flag} {why}")


def _fused(optimizer: object) -> bool:
    """The optimizer factory asks torch for its fused step."""
    return (getattr(optimizer, "implementation", None) == "fused"
            or bool(getattr(optimizer, "kwargs", {}).get("fused")))


def _model_dtype(spec: ModelSpec) -> torch.dtype:
    """The dtype of the model's floating parameters (float32 if it has none)."""
    for block in spec.blocks:
        for param in block.parameters():
            if param.is_floating_point():
                return param.dtype
    return torch.float32


def prepared(job: Job | PreparedJob) -> PreparedJob:
    """``job`` itself if already prepared, else :func:`prepare` (job)."""
    return job if isinstance(job, PreparedJob) else prepare(job)
