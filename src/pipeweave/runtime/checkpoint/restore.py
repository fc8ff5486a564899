"""Restoring one rank from a checkpoint: parameters, optimizer state, averaging references,
losses, the random generator, and the position in its program to start at.

Parameters are found by their global names (:mod:`pipeweave.models.naming`), so the plan may
differ from the one that wrote the checkpoint (see :mod:`.recovery`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ...ir import Action, Op, Schedule
from ...schedules import get_info
from ...models.naming import global_name, global_names
from .resume import optimizer_hyper
from ..communication.sharded import laid_out_like
from .store import CheckpointError, StoredCheckpoint
from ..job import Job
from ..execution.parts import RankParts

if TYPE_CHECKING:
    from ..execution.two_step import TwoStep

__all__ = ["ResumePoint", "restore_rank", "rekey_losses"]

@dataclass(frozen=True)
class ResumePoint:
    """Where a restored rank starts."""

    steps_done: int
    """Steps done before this run (the checkpoint's step)."""
    start: int
    """Position in the rank's program to start at."""
    rng_state: Tensor
    """CPU random generator state to start from."""


class _Shards:
    """The checkpoint's shards, each loaded once, and what one holds for a parallel pipeline."""

    def __init__(self, stored: StoredCheckpoint) -> None:
        self.stored = stored
        self._loaded: dict[str, dict[str, Any]] = {}

    def __getitem__(self, file: str) -> dict[str, Any]:
        if file not in self._loaded:
            self._loaded[file] = self.stored.load(file)
        return self._loaded[file]

    def part(self, file: str, pipeline: int) -> Mapping[str, Any]:
        return _pipeline_part(self[file], pipeline, f"checkpoint {self.stored.folder}, {file}")

    def holding(self, name: str, pipeline: int) -> Mapping[str, Any]:
        """What the shard holding parameter ``name`` saved for ``pipeline``."""
        return self.part(self.stored.file_of(name), pipeline)


IMPLEMENTATION_KEYS = frozenset({"foreach", "fused", "capturable", "differentiable"})
"""torch.optim settings that choose how a step is computed, not what it computes: another
device or mesh picks them anew (fused on a GPU, not for sharded parameters), so a resumed
run that differs only in them is not warned about."""


def _arithmetic(hyper: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The hyper-parameters per group without :data:`IMPLEMENTATION_KEYS`."""
    return [{k: v for k, v in group.items() if k not in IMPLEMENTATION_KEYS} for group in hyper]


def restore_rank(stored: StoredCheckpoint, *, job: Job, schedule: Schedule, rank: int,
                 parts: RankParts, device: torch.device, cuts: Mapping[int, int],
                 apply_rng: bool) -> ResumePoint:
    """Load ``rank``'s state from ``stored`` into ``parts`` (which
    :func:`~.resume.check_resume` found to fit, before any rank started); ``cuts``: the rank's iteration
    boundaries (:func:`~.boundaries.iteration_boundaries`). ``apply_rng``: also set this
    process's CPU generator (a distributed rank; the single-process executor swaps per rank)."""
    here = _arithmetic(optimizer_hyper(next(iter(parts.optimizers.values()))))
    written = _arithmetic(stored.manifest["optimizer"]["hyper"])
    if written != here and rank == 0:
        warnings.warn(f"resuming with optimizer settings {here}; the checkpoint was written "
                      f"with {written}", stacklevel=3)
    if parts.averagers and rank == 0:
        _warn_averaging_settings(stored, job)
    start = cuts[stored.step - 1]
    shards = _Shards(stored)
    _restore_pipelines(shards, schedule.programs[rank][:start], schedule.pipelines, parts)
    _restore_references(shards, schedule, parts)
    last = schedule.num_stages - 1
    if last in parts.stages and schedule.layout.stage_ranks[last][0] == rank:
        _restore_losses(shards, schedule, parts)
    rng_state = _rng_state(shards, job, schedule, rank, device)
    if apply_rng:
        torch.set_rng_state(rng_state)
    return ResumePoint(stored.step, start, rng_state)


def _restore_pipelines(shards: _Shards, done: Sequence[Action], pipelines: int,
                       parts: RankParts) -> None:
    """Parameters and optimizer state of every pipeline's stages; weight versions counted from
    the updates in ``done`` (the program before the resume point)."""
    for index in range(pipelines):
        pipeline = parts.pipeline(index)
        for stage_id, stage in pipeline.stages.items():
            # a copy of a tied parameter is restored from its first use's stored weight
            names = {param: parts.tied_to.get(name, name) for name, param in
                     global_names(stage.module.named_parameters(), stage.block_range[0])}
            layouts = stage.sharding.layouts if stage.sharding is not None else {}
            with torch.no_grad():  # whole tensors, cut to this rank's part when sharded
                for param, name in names.items():
                    param.copy_(_laid_out(param, shards.holding(name, index)["parameters"][name],
                                          layouts))
            optimizer = pipeline.optimizers[stage_id]
            state = optimizer.state_dict()
            params = [p for group in optimizer.param_groups for p in group["params"]]
            for position, param in enumerate(params):
                saved = shards.holding(names[param], index)["optimizer"].get(names[param])
                if saved:
                    state["state"][position] = {k: _state_value(param, v, layouts)
                                                for k, v in saved.items()}
            optimizer.load_state_dict(state)
            weights = pipeline.weights[stage_id]
            weights.live_version = sum(
                1 for a in done if a.op is Op.STEP and a.stage == stage_id and a.pipeline == index)
            if weights.directions is not None:  # PipeOptim, SpecTrain: predict from the state
                weights.directions.resume(weights.live_version)


def _state_value(param: Tensor, saved: Any, layouts: Mapping[int, "TwoStep"]) -> Any:
    """A saved optimizer state value for ``param``: a copy, laid out as ``param`` (sharded
    over ``dp`` or split over ``tp``) when it has the parameter's shape (Adam's moments,
    momentum); a step counter stays as saved."""
    if not isinstance(saved, Tensor):
        return saved
    if saved.shape == param.shape:
        return _laid_out(param, saved.clone(), layouts)
    return saved.clone()


def _laid_out(param: Tensor, whole: Tensor, layouts: Mapping[int, "TwoStep"]) -> Tensor:
    """``whole`` as ``param``'s part: in two steps on a stage sharded over ``dp`` on top of
    ``tp`` (:mod:`..execution.two_step`), else as :func:`laid_out_like`."""
    layout = layouts.get(id(param))
    if layout is None:
        return laid_out_like(param, whole)
    from ..execution.two_step import two_step_part  # FSDP2 only where sharded

    return two_step_part(param, whole, layout)


def _restore_references(shards: _Shards, schedule: Schedule, parts: RankParts) -> None:
    """AvgPipe: every stage's reference model (:class:`~..averaging.elastic.ElasticAverager`)."""
    stored = shards.stored
    for stage_id, averager in parts.averagers.items():
        first = parts.stages[stage_id].block_range[0]
        reference = {}
        for local in averager.reference_parameters():
            name = global_name(local, first)
            saved = shards[stored.file_of(name)].get("reference")
            if saved is None and schedule.pipelines == 1:
                # Written without averaging (e.g. by 1f1b): with one pipeline the reference
                # *is* that pipeline's model at every iteration boundary (runtime/execution/elastic_averaging.py).
                saved = shards[stored.file_of(name)]["parameters"]
            if saved is None or name not in saved:
                raise CheckpointError(
                    f"checkpoint {stored.folder} holds no reference model for {name} "
                    f"({stored.file_of(name)}), which {schedule.name!r} with "
                    f"{schedule.pipelines} pipelines needs; it was not written by an "
                    f"averaging run. Resume it with the schedule it was written with "
                    f"({stored.manifest['schedule']!r})")
            reference[local] = saved[name]
        averager.load_reference(reference, stored.step)


def _restore_losses(shards: _Shards, schedule: Schedule, parts: RankParts) -> None:
    """The losses so far, on the rank that reports the last stage's (re-keyed if M changed)."""
    stored = shards.stored
    last = schedule.num_stages - 1
    saved_m = int(stored.manifest["plan"]["microbatches"])
    for entry in stored.manifest["shards"]:
        if not entry["has_losses"]:
            continue
        for index in range(schedule.pipelines):
            losses = shards.part(entry["file"], index)["losses"]
            saved = dict(zip(losses["microbatch"].tolist(), losses["value"].tolist()))
            parts.pipeline(index).stages[last].loss_log.restore(
                rekey_losses(saved, saved_m, schedule.microbatches))


def _rng_state(shards: _Shards, job: Job, schedule: Schedule, rank: int,
               device: torch.device) -> Tensor:
    """The saved generator state with the same layout; otherwise a fresh one from the seed and
    step (under another layout no rank's stream of random numbers carries over)."""
    stored = shards.stored
    if _same_layout(stored, job, schedule):
        rng = shards[f"rank{rank}.pt"]["rng"]
        if device.type == "cuda" and rng.get("cuda") is not None:
            torch.cuda.set_rng_state(rng["cuda"], device)
        return rng["cpu"].clone()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(job.seed * 1_000_003 + stored.step)
        return torch.get_rng_state()


def _warn_averaging_settings(stored: StoredCheckpoint, job: Job) -> None:
    """Like the optimizer's hyper-parameters: the resumed run's alpha and order apply."""
    keys = ("alpha", "average_order")
    saved = {k: v for k, v in stored.manifest["plan"].get("semantics", {}).items() if k in keys}
    here = {k: v for k, v in job.plan.to_json().get("semantics", {}).items() if k in keys}
    if saved != here:
        warnings.warn(f"resuming with averaging settings {here or 'defaults'}; the checkpoint "
                      f"was written with {saved or 'defaults'}", stacklevel=4)


def _same_layout(stored: StoredCheckpoint, job: Job, schedule: Schedule) -> bool:
    """Every rank holds the stages it held when the checkpoint was written."""
    saved, plan = stored.manifest["plan"], job.plan.to_json()
    keys = ("stages", "chunks", "replicas", "width", "pipelines")
    return (stored.manifest["world_size"] == schedule.num_ranks
            and all(saved[k] == plan[k] for k in keys)
            and (plan["chunks"] == 1
                 or _placement(stored.manifest["schedule"]) == _placement(schedule.name)))


def _placement(schedule: str) -> str | None:
    """How a schedule places its chunks (interleaved or V; None: no longer registered)."""
    try:
        return get_info(schedule).placement
    except ValueError:
        return None


def rekey_losses(losses: Mapping[int, float], saved_microbatches: int,
                 microbatches: int) -> dict[int, float]:
    """Micro-batch losses written under ``saved_microbatches`` per iteration, keyed for a run
    with ``microbatches``: a run reads a micro-batch ``j``'s loss as part of iteration
    ``j // M``, so after a change of M each restored iteration's total (the weighted losses of
    an iteration sum to the batch's mean loss) sits at its first micro-batch."""
    if saved_microbatches == microbatches:
        return dict(losses)
    totals: dict[int, float] = {}
    for microbatch, value in losses.items():
        iteration = microbatch // saved_microbatches
        totals[iteration] = totals.get(iteration, 0.0) + value
    return {iteration * microbatches: total for iteration, total in totals.items()}


def _pipeline_part(data: Mapping[str, Any], pipeline: int, where: str) -> Mapping[str, Any]:
    """A shard's ``parameters``/``optimizer``/``losses`` of one AvgPipe pipeline: pipeline 0's
    at the top level (as for every schedule), the others' under ``pipelines["<p>"]``."""
    if pipeline == 0:
        return data
    try:
        return data["pipelines"][str(pipeline)]
    except KeyError:
        raise CheckpointError(f"{where} holds no state for parallel pipeline {pipeline} "
                              f"(damaged, or written by another version)") from None
