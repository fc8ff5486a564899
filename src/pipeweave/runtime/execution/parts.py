"""Building one rank's part of a job and running it; results as plain data.

:func:`build_rank` turns a :class:`Job` into the stages and optimizers a rank owns;
:func:`make_schedule` produces the lowered schedule every rank interprets (the same pure
function on every rank, so no schedule travels between processes).
"""

from __future__ import annotations

import copy
import resource
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ...ir import Op, Schedule, lower
from ...ir.updates import update_sizes
from ...models import ModelSpec
from ...schedules import build_schedule
from ..job import Job
from ...planner.plan import Plan
from ..averaging.elastic import ElasticAverager
from .stage import StageRuntime
from .weights import StageWeights

__all__ = ["RankParts", "RankResult", "build_rank", "make_schedule", "check_model_fits_plan",
           "peak_rss_bytes", "preflight"]

def make_schedule(plan: Plan, steps: int) -> Schedule:
    """The lowered schedule for ``steps`` iterations of ``plan``."""
    schedule = build_schedule(plan.schedule, plan.shape(steps))
    if schedule.num_stages != len(plan.stages):
        per_rank = schedule.num_stages // plan.depth
        raise ValueError(
            f"schedule {plan.schedule!r} lays out {schedule.num_stages} stages ({per_rank} "
            f"chunk(s) per rank on {plan.depth} ranks) but the plan has {len(plan.stages)} "
            f"(chunks={plan.chunks}); use --chunks {per_rank} (Plan chunks={per_rank})"
        )
    return lower(schedule)


def check_model_fits_plan(spec: ModelSpec, plan: Plan) -> None:
    if len(spec.blocks) != plan.num_blocks:
        raise ValueError(
            f"plan covers {plan.num_blocks} blocks but model {spec.name!r} has "
            f"{len(spec.blocks)}; make the plan for this model (e.g. Plan.uniform("
            f"{len(spec.blocks)}, depth))"
        )


def preflight(spec: ModelSpec, plan: Plan, inputs: Tensor) -> None:
    """Run one sample through the stages in order, before any process starts.

    A stage that cannot take its predecessor's output (a shape or dtype mismatch between
    stages) is reported with both stages' block ranges and the shape that was passed.
    """
    check_model_fits_plan(spec, plan)
    if inputs.shape[0] % plan.microbatches:
        raise ValueError(
            f"batch size {inputs.shape[0]} is not divisible by microbatches={plan.microbatches}; "
            f"use a batch size that is a multiple of {plan.microbatches}"
        )
    modes = [block.training for block in spec.blocks]
    for block in spec.blocks:
        block.eval()  # no running-statistics updates, no dropout
    try:
        x = inputs[:1]
        with torch.no_grad():
            for index, (start, end) in enumerate(plan.stages):
                for block_index in range(start, end):
                    try:
                        x = spec.blocks[block_index](x)
                    except Exception as error:
                        where = ("the model input" if block_index == 0 else
                                 f"the output of block {block_index - 1}")
                        boundary = " (a stage boundary)" if block_index == start and index else ""
                        raise ValueError(
                            f"stage {index} (blocks {start}..{end - 1}) cannot run block "
                            f"{block_index} ({spec.block_names[block_index]}) on {where}{boundary}, "
                            f"shape {tuple(x.shape)} dtype {x.dtype}: {error}. Check that "
                            f"consecutive blocks agree on shapes"
                        ) from error
                    if not isinstance(x, Tensor):
                        raise TypeError(
                            f"block {block_index} ({spec.block_names[block_index]}) returned "
                            f"{type(x).__name__}; every block must return one tensor"
                        )
    finally:
        for block, mode in zip(spec.blocks, modes):
            block.train(mode)


@dataclass
class RankParts:
    """What one rank owns for one pipeline; AvgPipe's further parallel pipelines in ``others``."""

    stages: dict[int, StageRuntime]
    optimizers: dict[int, torch.optim.Optimizer]
    weights: dict[int, StageWeights]
    others: list["RankParts"] = field(default_factory=list)
    """Parallel pipelines 1..N-1 (AvgPipe), each with its own copy of this rank's stages."""
    averagers: dict[int, ElasticAverager] = field(default_factory=dict)
    """Per stage, the reference model of the N parallel pipelines (AvgPipe)."""

    def pipeline(self, index: int) -> "RankParts":
        return self if index == 0 else self.others[index - 1]


def build_rank(job: Job, rank: int, schedule: Schedule, device: torch.device,
               spec: ModelSpec | None = None) -> RankParts:
    """Stages (deep copies of the model's blocks) and optimizers for the stages ``rank`` hosts.

    With N parallel pipelines (AvgPipe) every pipeline gets its own copies, all starting from
    the same initial weights, and every stage an :class:`ElasticAverager` holding the reference.
    """
    spec = job.model() if spec is None else spec
    check_model_fits_plan(spec, job.plan)
    sizes = update_sizes(schedule)
    parts = [_build_pipeline(job, rank, schedule, device, spec, p, sizes)
             for p in range(schedule.pipelines)]
    main = parts[0]
    main.others = parts[1:]
    if any(a.op is Op.AVERAGE for a in schedule.programs[rank]):
        semantics = job.plan.semantics
        for stage, runtime in main.stages.items():
            main.averagers[stage] = ElasticAverager(
                stage=stage, pipelines=schedule.pipelines, initial=runtime.module,
                alpha=semantics.alpha, order=semantics.order)
    return main


def _build_pipeline(job: Job, rank: int, schedule: Schedule, device: torch.device,
                    spec: ModelSpec, pipeline: int,
                    sizes: Mapping[tuple[int, int], int]) -> RankParts:
    """``sizes``: micro-batches per update of every (stage, pipeline), ``update_sizes``."""
    last = schedule.num_stages - 1
    last_size = sizes[(last, pipeline)]
    stages: dict[int, StageRuntime] = {}
    optimizers: dict[int, torch.optim.Optimizer] = {}
    weights: dict[int, StageWeights] = {}
    backward = job.plan.semantics.backward_mode
    for stage in schedule.layout.stages_of(rank):
        start, end = job.plan.stages[stage]
        module = nn.Sequential(*copy.deepcopy(list(spec.blocks[start:end]))).to(device)
        stages[stage] = StageRuntime(
            stage=stage, blocks=module, block_range=(start, end), is_first=stage == 0,
            is_last=stage == last, loss_fn=spec.loss_fn, recompute=job.plan.recompute_stage(stage),
            loss_scale=schedule.microbatches / last_size,
            update_scale=last_size / sizes[(stage, pipeline)],
        )
        optimizers[stage] = job.optimizer(module.parameters())
        weights[stage] = StageWeights(
            stage=stage, module=module, optimizer=optimizers[stage], program=schedule.programs[rank],
            recompute=job.plan.recompute_stage(stage), backward=backward,
            spectrain=schedule.name == "spectrain", pipeline=pipeline,
        )
    return RankParts(stages, optimizers, weights)


@dataclass
class RankResult:
    """What a rank reports after a run (plain data, picklable)."""

    rank: int
    losses: dict[int, float] = field(default_factory=dict)
    """Weighted loss per micro-batch (ranks hosting the last stage)."""
    records: list[tuple[int, str, float, float]] = field(default_factory=list)
    peak_memory_bytes: int = 0
    peak_stashed_microbatches: int = 0
    parameters: dict[str, Tensor] = field(default_factory=dict)
    """``"<block>.<name>" -> tensor`` for the blocks this rank owns (first replica only); with
    parallel pipelines, the reference model's values."""
    pipeline_losses: dict[int, dict[int, float]] = field(default_factory=dict)
    """AvgPipe: losses of parallel pipelines 1..N-1 (``losses`` holds pipeline 0's)."""
    peak_weight_versions: dict[int, int] = field(default_factory=dict)
    """Per stage on this rank: most weight sets held at once (live, stashed, predicted)."""
    peak_weight_copies: dict[int, int] = field(default_factory=dict)
    """Per stage: most weight sets held at once besides the live parameters. The sets can
    exceed the versions by one where a forward at the live version is followed by an update
    before its backward (PipeDream's and 2BW's first stages): autograd keeps the tensors that
    forward ran on, so it runs on a copy that the in-place update leaves alone
    (docs/semantics.md)."""
    weight_replicas: dict[int, int] = field(default_factory=dict)
    """Per stage: module replicas built to hold stashed/predicted versions (runtime/execution/replicas.py);
    all of them are built during the first iteration and reused after it."""
    weight_bytes_copied: dict[int, int] = field(default_factory=dict)
    """Per stage: bytes copied from the live weights into replicas (stashing versions)."""
    updates: dict[int, int] = field(default_factory=dict)
    """Per stage: optimizer steps taken."""
    prediction_seconds: dict[int, float] = field(default_factory=dict)
    """Per stage: time spent computing predicted weights (PipeOptim, SpecTrain)."""
    wall_seconds: float = 0.0
    checkpoint_stall_s: float = 0.0
    """Seconds this rank's training thread spent on checkpoints (see runtime/checkpoint/recovery.py)."""
    bytes_sent: int = 0
    """Bytes of activations and gradients this rank sent to other ranks (one-time shape headers
    and APC metadata included, all-reduces not); the same in both executors."""
    advance_per_step: list[int] = field(default_factory=list)
    """AvgPipe with the online advance controller: the advance each step ran with."""
    advance_log: list[dict[str, Any]] = field(default_factory=list)
    """AvgPipe's online controller, per measured step: the time and memory all ranks agreed on
    and the decision (see runtime/averaging/online.py); the same on every rank."""


PARTIAL = "pipeweave_partial_results"
"""Attribute of an exception raised by a run: the :class:`RankResult` s of the ranks that
recorded what they had done when it stopped (losses, timeline), for the outputs of a failed
or interrupted run."""


def attach_partial(error: BaseException, *results: RankResult) -> None:
    """Add ``results`` to ``error`` (:data:`PARTIAL`)."""
    setattr(error, PARTIAL, [*getattr(error, PARTIAL, []), *results])


def partial_results(error: BaseException) -> list[RankResult]:
    return list(getattr(error, PARTIAL, []))


def collect_result(rank: int, parts: RankParts, schedule: Schedule, *, records: list[tuple[int, str, float, float]],
                   want_parameters: bool, wall: float, device: torch.device) -> RankResult:
    result = RankResult(rank=rank, records=records, wall_seconds=wall)
    for stage_id, stage in parts.stages.items():
        result.losses.update(stage.losses)
        result.peak_stashed_microbatches = max(result.peak_stashed_microbatches, stage.peak_stashed)
        weights = parts.weights[stage_id]
        result.peak_weight_versions[stage_id] = weights.peak_versions
        result.peak_weight_copies[stage_id] = weights.peak_copies
        result.weight_replicas[stage_id] = weights.replicas.allocations
        result.weight_bytes_copied[stage_id] = weights.replicas.bytes_copied
        result.updates[stage_id] = weights.live_version
        result.prediction_seconds[stage_id] = weights.prediction_seconds
        if want_parameters and schedule.layout.stage_ranks[stage_id][0] == rank:
            averager = parts.averagers.get(stage_id)
            result.parameters.update(_named_parameters(
                stage, averager.reference_parameters() if averager is not None else None))
    for index, other in enumerate(parts.others, start=1):
        for stage in other.stages.values():
            result.pipeline_losses.setdefault(index, {}).update(stage.losses)
    result.peak_memory_bytes = (torch.cuda.max_memory_allocated(device) if device.type == "cuda"
                                else peak_rss_bytes())
    return result


def _named_parameters(stage: StageRuntime,
                      values: Mapping[str, Tensor] | None = None) -> Mapping[str, Tensor]:
    """``"<block>.<name>"`` keys for the stage's parameters (or for ``values``, same names)."""
    start = stage.block_range[0]
    named = {}
    source = values.items() if values is not None else stage.module.named_parameters()
    for name, param in source:
        index, _, rest = name.partition(".")
        named[f"{start + int(index)}.{rest}"] = param.detach().cpu().clone()
    return named


def peak_rss_bytes() -> int:
    """Peak resident memory of this process (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)
