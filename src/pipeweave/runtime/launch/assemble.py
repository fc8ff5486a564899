"""One way to build a rank: the parts, resume point, data, recorder and interpreter of a rank,
the same for the distributed executor (:mod:`.rank`) and the single-process one
(:mod:`.single_process`), which differ only in their transport and how they drive it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from ...ir import Schedule
from ...models import ModelSpec
from ..advance.online import OnlineAdvance
from ..checkpoint.boundaries import combine_hooks
from ..checkpoint.recovery import RankRecovery
from ..checkpoint.resume import Session
from ..communication.transport import Transport
from ..execution.clipping import GradientClipper
from ..execution.corrections import step_corrections
from ..execution.features import MeterActivations, PositionHooks, RankFeature, RecordTimeline
from ..execution.gathers import prefetch_gathers
from ..execution.global_check import GlobalCheck, has_global_check
from ..execution.interpreter import RankInterpreter, RankIO
from ..execution.microbatches import MicrobatchSource, data_window
from ..execution.parts import GroupOf, RankParts, build_rank
from ..execution.ties import TiedGradients
from ..observation.memory import ActivationMeter, state_bytes
from ..observation.results import RankResult, collect_result
from ..checkpoint.snapshots import WeightSnapshots
from ..observation.timeline import Recorder
from .prepare import PreparedJob

if TYPE_CHECKING:
    from ..execution.tensor_parallel import RankMesh

__all__ = ["AssembledRank", "RankFeatures", "FeatureFactory", "assemble_rank"]

FeatureFactory = Callable[[int, Schedule], Sequence[RankFeature]]
"""``(rank, program) -> features`` for that rank's interpreter of ``program`` (the whole run's
schedule, or with the online advance controller each window's): features a caller adds
(``run_local(features=...)``, ``on_step``, fault injection)."""


@dataclass(frozen=True)
class RankFeatures:
    """What a rank's run adds around its actions, besides the tied gradients and the
    checkpoints (which the job and the recovery give); :meth:`AssembledRank.interpreter`
    turns them into the interpreter's feature list."""

    clipper: GradientClipper | None = None
    """Global gradient-norm clipping (``Job.clip_grad_norm``)."""
    check: GlobalCheck | None = None
    """The global check of a checked schedule (zb-h2's ``post_validation``), which clips
    instead of the clipper."""
    meter: ActivationMeter | None = None
    """Counts the activation bytes held over the whole run (``Job.count_activations``)."""
    snapshots: WeightSnapshots | None = None
    """Copies the weights for the held-out loss (``Job.eval_every``)."""
    recorder: Recorder | None = None
    """The timeline (``Job.record_timeline``; :meth:`AssembledRank.with_timeline`)."""
    extra: FeatureFactory | None = None
    """Features a caller adds (:meth:`AssembledRank.with_features`)."""


@dataclass(frozen=True)
class AssembledRank:
    """Everything one rank runs with; :meth:`interpreter` for the whole run's program or, with
    the online advance controller, for each window's. Immutable: :meth:`with_timeline` and
    :meth:`with_features` return a new one."""

    rank: int
    prepared: PreparedJob
    parts: RankParts
    recovery: RankRecovery
    io: RankIO
    features: RankFeatures = RankFeatures()

    def with_timeline(self, origin: float, device: torch.device) -> AssembledRank:
        """This rank recording its timeline from now on (when the job asks for it), its zero at
        ``origin`` (``time.time()``); on a GPU with CUDA events on ``device`` (device time,
        :mod:`..observation.timeline`)."""
        if not self.prepared.job.record_timeline:
            return self
        return replace(self, features=replace(self.features,
                                              recorder=Recorder(self.rank, origin, device)))

    def with_features(self, factory: FeatureFactory) -> AssembledRank:
        """This rank with the features ``factory`` gives for each program, after any added
        before."""
        earlier = self.features.extra

        def both(rank: int, program: Schedule) -> list[RankFeature]:
            return [*(earlier(rank, program) if earlier is not None else ()),
                    *factory(rank, program)]
        return replace(self, features=replace(self.features, extra=both))

    def interpreter(self, program: Schedule | None = None,
                    meter: ActivationMeter | None = None) -> RankInterpreter:
        """The interpreter of ``program`` (default: the whole run's schedule, started at the
        resume point with the checkpoint hooks; a window's program starts at 0 without them)."""
        whole = program is None or program is self.prepared.schedule
        program = self.prepared.schedule if program is None else program
        return RankInterpreter(rank=self.rank, schedule=program, parts=self.parts, io=self.io,
                               features=self._features(program, whole, meter),
                               start=self.recovery.start if whole else 0)

    def _features(self, program: Schedule, whole: bool,
                  meter: ActivationMeter | None) -> list[RankFeature]:
        """In the order their hooks run: the timeline first (what the others do before an
        action is its time), the gradients' sums and clipping, the step
        corrections (nesterov, pipemare), the meter, the caller's, the sharded stages'
        early gathers (:mod:`..execution.gathers`: last before an action, first after it of
        what computes), and the hooks at positions (checkpoints, then weight snapshots)."""
        own = self.features
        if meter is None and whole:
            meter = own.meter
        found: list[RankFeature | None] = [
            None if own.recorder is None else RecordTimeline(own.recorder),
            TiedGradients(rank=self.rank, schedule=program, ties=self.prepared.ties)
            if self.prepared.ties else None,
            own.clipper if whole else None, own.check if whole else None,
            step_corrections(program, self.prepared.job.plan),
            None if meter is None else MeterActivations(meter),
            *(own.extra(self.rank, program) if own.extra is not None else ()),
            prefetch_gathers(program.programs[self.rank], self.parts)
            if self.prepared.job.prefetch_gathers else None]
        if whole:
            found.append(PositionHooks(combine_hooks(
                self.recovery.hooks, own.snapshots.hooks if own.snapshots else {})))
        elif hooks := self.recovery.window_hooks(program):  # a checkpoint's fence
            found.append(PositionHooks(hooks))
        return [feature for feature in found if feature is not None]

    def online_advance(self) -> OnlineAdvance | None:
        """AvgPipe's online advance controller of this run (None without ``Job.advance``):
        its windows end where checkpoints are due, and it continues from the checkpoint
        resumed (:mod:`..advance.online`)."""
        job = self.prepared.job
        if job.advance is None:
            return None
        options = job.checkpoint
        stops = [] if options is None else [
            k for k in range(1, job.steps + 1) if options.writes_after(k, job.steps)]
        online = OnlineAdvance(job.plan, job.steps, job.advance, stops=stops)
        state, done = self.recovery.advance_state, self.recovery.steps_done
        if done:
            assert state is not None, "prepare checks the checkpoint holds the controller"
            online.restore(state, done)
        return online

    def end_window(self, online: OnlineAdvance, steps_done: int) -> None:
        """After a window of ``online``: the checkpoint after ``steps_done`` steps, if due."""
        self.recovery.checkpoint_window(steps_done, online.state())

    def result(self, *, wall: float, device: torch.device, online: OnlineAdvance | None = None,
               final: bool = True, losses: bool = True, state: bool = True) -> RankResult:
        """What the rank reports; ``final`` False: a failed run's partial result (no
        parameters); ``losses`` False: without the losses, and on a GPU only the timeline of
        actions that already ran (for the journal, at every step: nothing waits for the GPU);
        ``state`` False: without walking the model state (``state_bytes`` 0; the journal
        measures it now and then, :mod:`..observation.journal`)."""
        job = self.prepared.job
        own = self.features
        records = [] if own.recorder is None else (
            own.recorder.records if losses else own.recorder.ready_records())
        result = collect_result(self.rank, self.parts, self.prepared.schedule,
                                records=records,
                                want_parameters=final and job.return_parameters, wall=wall,
                                device=device, want_losses=losses)
        result.checkpoint_stall_s = self.recovery.stall_s
        if own.clipper is not None:
            result.grad_norms = list(own.clipper.norms)
        if own.check is not None:
            result.grad_norms = list(own.check.norms)
            result.redone_updates = list(own.check.redone)
            result.undone_updates = list(own.check.undone)
        result.bytes_sent = self.io.transport.bytes_sent
        if own.snapshots is not None and losses:  # not in every journal frame
            result.snapshots = own.snapshots.taken
        if own.meter is not None:
            result.peak_activation_bytes = own.meter.peak
            result.state_bytes = state_bytes(self.parts) if state else 0
        if online is not None:
            result.advance_per_step, result.advance_log = online.advance_per_step, online.log
        return result


def assemble_rank(prepared: PreparedJob, rank: int, *, device: torch.device,
                  transport: Transport, session: Session | None,
                  spec: ModelSpec | None = None, apply_rng: bool = True,
                  group_of: GroupOf | None = None,
                  mesh: "RankMesh | None" = None) -> AssembledRank:
    """Build ``rank``'s part of ``prepared``: its stages and optimizers (from ``spec`` or the
    job's model factory), restored when resuming (``session``), and its data positioned at the
    resume point (the timeline starts with :meth:`AssembledRank.with_timeline`).
    ``apply_rng``: set this process's random generator from the checkpoint (one process per
    rank). ``group_of``: a stage's process group, for FSDP2 (``Plan.shard``; distributed runs
    only). ``mesh``: this process's place in the ``(pp, dp, tp)`` mesh (``Plan.tp``)."""
    job = prepared.job
    parts = build_rank(job, rank, prepared.schedule, device, spec=spec, group_of=group_of,
                       mesh=mesh)
    recovery = RankRecovery(job=job, schedule=prepared.schedule, rank=rank, parts=parts,
                            device=device, session=session, apply_rng=apply_rng,
                            writes=mesh is None or mesh.tp_index == 0)
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
    return AssembledRank(rank, prepared, parts, recovery, RankIO(data, transport),
                         RankFeatures(clipper=clipper, check=check, meter=meter,
                                      snapshots=snapshots))
