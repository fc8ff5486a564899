"""One way to build a rank: the parts, resume point, data, recorder and interpreter of a rank,
the same for the distributed executor (:mod:`.rank`) and the single-process one
(:mod:`.single_process`), which differ only in their transport and how they drive it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from ...ir import Action, Schedule
from ...models import ModelSpec
from ..advance.online import OnlineAdvance
from ..checkpoint.boundaries import Hooks, combine_hooks
from ..checkpoint.recovery import RankRecovery
from ..checkpoint.resume import Session
from ..communication.transport import Transport
from ..execution.clipping import GradientClipper
from ..execution.global_check import GlobalCheck, has_global_check
from ..execution.interpreter import RankInterpreter
from ..execution.microbatches import MicrobatchSource, data_window
from ..execution.parts import GroupOf, RankParts, build_rank
from ..execution.stage import StageRuntime
from ..execution.ties import TiedGradients
from ..observation.memory import ActivationMeter, state_bytes
from ..observation.results import RankResult, collect_result
from ..checkpoint.snapshots import WeightSnapshots
from ..observation.timeline import Recorder
from .prepare import PreparedJob

__all__ = ["AssembledRank", "assemble_rank"]


@dataclass
class AssembledRank:
    """Everything one rank runs with; :meth:`interpreter` for the whole run's program or, with
    the online advance controller, for each window's."""

    rank: int
    prepared: PreparedJob
    parts: RankParts
    recovery: RankRecovery
    data: MicrobatchSource
    transport: Transport
    recorder: Recorder | None = None
    on_step: Callable[[Action, Mapping[int, StageRuntime]], None] | None = None
    extra_hooks: Callable[[Schedule], Hooks] = field(default=lambda program: {})
    """Hooks for a program besides the checkpoints' (fault injection in distributed runs)."""
    clipper: GradientClipper | None = None
    """Global gradient-norm clipping (``Job.clip_grad_norm``)."""
    check: GlobalCheck | None = None
    """The global check of a checked schedule (zb-h2's ``post_validation``), which clips
    instead of the clipper."""
    meter: ActivationMeter | None = None
    """Counts the activation bytes held over the whole run (``Job.count_activations``)."""
    snapshots: WeightSnapshots | None = None
    """Copies the weights for the held-out loss (``Job.eval_every``)."""

    def start_timeline(self, origin: float, device: torch.device) -> None:
        """Record the timeline from now on, its zero at ``origin`` (``time.time()``); on a
        GPU with CUDA events on ``device`` (device time, :mod:`..observation.timeline`)."""
        if self.prepared.job.record_timeline:
            self.recorder = Recorder(self.rank, origin, device)

    def interpreter(self, program: Schedule | None = None,
                    meter: ActivationMeter | None = None) -> RankInterpreter:
        """The interpreter of ``program`` (default: the whole run's schedule, started at the
        resume point with the checkpoint hooks; a window's program starts at 0 without them)."""
        whole = program is None or program is self.prepared.schedule
        program = self.prepared.schedule if program is None else program
        if meter is None and whole:
            meter = self.meter
        hooks = combine_hooks(self.recovery.hooks if whole else {},
                              self.snapshots.hooks if whole and self.snapshots else {},
                              self.extra_hooks(program))
        ties = (TiedGradients(rank=self.rank, schedule=program, ties=self.prepared.ties)
                if self.prepared.ties else None)
        return RankInterpreter(rank=self.rank, schedule=program, parts=self.parts,
                               transport=self.transport, data=self.data, recorder=self.recorder,
                               on_step=self.on_step, start=self.recovery.start if whole else 0,
                               after=hooks, meter=meter, clipper=self.clipper if whole else None,
                               ties=ties, check=self.check if whole else None)

    def result(self, *, wall: float, device: torch.device, online: OnlineAdvance | None = None,
               final: bool = True, losses: bool = True) -> RankResult:
        """What the rank reports; ``final`` False: a failed run's partial result (no
        parameters); ``losses`` False: without the losses, and on a GPU only the timeline of
        actions that already ran (for the journal, at every step: nothing waits for the GPU)."""
        job = self.prepared.job
        records = [] if self.recorder is None else (
            self.recorder.records if losses else self.recorder.ready_records())
        result = collect_result(self.rank, self.parts, self.prepared.schedule,
                                records=records,
                                want_parameters=final and job.return_parameters, wall=wall,
                                device=device, want_losses=losses)
        result.checkpoint_stall_s = self.recovery.stall_s
        if self.clipper is not None:
            result.grad_norms = list(self.clipper.norms)
        if self.check is not None:
            result.grad_norms = list(self.check.norms)
            result.redone_updates = list(self.check.redone)
            result.undone_updates = list(self.check.undone)
        result.bytes_sent = self.transport.bytes_sent
        if self.snapshots is not None and losses:  # not in every journal frame
            result.snapshots = self.snapshots.taken
        if self.meter is not None:
            result.peak_activation_bytes = self.meter.peak
            result.state_bytes = state_bytes(self.parts)
        if online is not None:
            result.advance_per_step, result.advance_log = online.advance_per_step, online.log
        return result


def assemble_rank(prepared: PreparedJob, rank: int, *, device: torch.device,
                  transport: Transport, session: Session | None,
                  spec: ModelSpec | None = None, apply_rng: bool = True,
                  group_of: GroupOf | None = None) -> AssembledRank:
    """Build ``rank``'s part of ``prepared``: its stages and optimizers (from ``spec`` or the
    job's model factory), restored when resuming (``session``), and its data positioned at the
    resume point (the timeline starts with :meth:`AssembledRank.start_timeline`). ``apply_rng``: set this
    process's random generator from the checkpoint (one process per rank). ``group_of``: a
    stage's process group, for FSDP2 (``Plan.shard``; distributed runs only)."""
    job = prepared.job
    parts = build_rank(job, rank, prepared.schedule, device, spec=spec, group_of=group_of)
    recovery = RankRecovery(job=job, schedule=prepared.schedule, rank=rank, parts=parts,
                            device=device, session=session, apply_rng=apply_rng)
    window = data_window(prepared.schedule.programs[rank], microbatches=job.plan.microbatches,
                         pipelines=job.plan.pipelines)
    data = MicrobatchSource(recovery.positioned(job.data()), microbatches=job.plan.microbatches,
                            pipelines=job.plan.pipelines, device=device, window=window,
                            first_batch=recovery.first_batch)
    clipper = check = None
    if has_global_check(prepared.schedule):
        check = GlobalCheck(rank=rank, schedule=prepared.schedule, max_norm=job.clip_grad_norm,
                            stages=parts.stages, optimizers=parts.optimizers, device=device)
    elif job.clip_grad_norm is not None:
        ties = TiedGradients(rank=rank, schedule=prepared.schedule, ties=prepared.ties)
        clipper = GradientClipper(rank=rank, schedule=prepared.schedule,
                                  max_norm=job.clip_grad_norm, stages=parts.stages,
                                  duplicates=ties.duplicates(
                                      {s: stage.module for s, stage in parts.stages.items()}),
                                  device=device)
    meter = ActivationMeter() if job.count_activations else None
    snapshots = (WeightSnapshots(rank=rank, parts=parts, schedule=prepared.schedule,
                                 every=job.eval_every, steps_done=recovery.steps_done)
                 if job.eval_every else None)
    return AssembledRank(rank, prepared, parts, recovery, data, transport, clipper=clipper,
                         check=check, meter=meter, snapshots=snapshots)
