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

import torch
from torch import Tensor, nn

from ..ir import Schedule, lower
from ..models import ModelSpec
from ..schedules import build_schedule
from .job import Job
from .plan import Plan
from ..schedules.pipeoptim import prediction_distance
from .stage import StageRuntime
from .weights import StageWeights

__all__ = ["RankParts", "RankResult", "build_rank", "make_schedule", "check_model_fits_plan",
           "peak_rss_bytes", "preflight"]

SUPPORTED = frozenset({"gpipe", "1f1b", "interleaved-1f1b", "sliced-1f1b", "pipedream", "2bw",
                       "pipeoptim", "spectrain", "wpipe"})


def make_schedule(plan: Plan, steps: int) -> Schedule:
    """The lowered schedule for ``steps`` iterations of ``plan``."""
    schedule = build_schedule(plan.schedule, plan.shape(steps))
    if plan.schedule not in SUPPORTED:
        raise ValueError(
            f"schedule {plan.schedule!r} is not supported by the runtime yet; the runtime runs "
            f"{sorted(SUPPORTED)} (the simulator knows every schedule)"
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
    stages: dict[int, StageRuntime]
    optimizers: dict[int, torch.optim.Optimizer]
    weights: dict[int, StageWeights]


def build_rank(job: Job, rank: int, schedule: Schedule, device: torch.device,
               spec: ModelSpec | None = None) -> RankParts:
    """Stages (deep copies of the model's blocks) and optimizers for the stages ``rank`` hosts."""
    spec = job.model() if spec is None else spec
    check_model_fits_plan(spec, job.plan)
    last = schedule.num_stages - 1
    stages: dict[int, StageRuntime] = {}
    optimizers: dict[int, torch.optim.Optimizer] = {}
    weights: dict[int, StageWeights] = {}
    backward = str(job.plan.semantics.get("backward", "recompute"))
    for stage in schedule.layout.stages_of(rank):
        start, end = job.plan.stages[stage]
        module = nn.Sequential(*copy.deepcopy(list(spec.blocks[start:end]))).to(device)
        stages[stage] = StageRuntime(
            stage=stage, blocks=module, block_range=(start, end), is_first=stage == 0,
            is_last=stage == last, loss_fn=spec.loss_fn, recompute=job.plan.recompute_stage(stage),
        )
        optimizers[stage] = job.optimizer(module.parameters())
        weights[stage] = StageWeights(
            stage=stage, module=module, optimizer=optimizers[stage], program=schedule.programs[rank],
            recompute=job.plan.recompute_stage(stage), backward=backward,
            spectrain=schedule.name == "spectrain",
            distance=lambda action: prediction_distance(schedule, action),
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
    """``"<block>.<name>" -> tensor`` for the blocks this rank owns (first replica only)."""
    peak_weight_versions: dict[int, int] = field(default_factory=dict)
    """Per stage on this rank: most weight sets held at once (live, stashed, predicted)."""
    wall_seconds: float = 0.0


def collect_result(rank: int, parts: RankParts, schedule: Schedule, *, records: list[tuple[int, str, float, float]],
                   want_parameters: bool, wall: float, device: torch.device) -> RankResult:
    result = RankResult(rank=rank, records=records, wall_seconds=wall)
    for stage_id, stage in parts.stages.items():
        result.losses.update(stage.losses)
        result.peak_stashed_microbatches = max(result.peak_stashed_microbatches, stage.peak_stashed)
        result.peak_weight_versions[stage_id] = parts.weights[stage_id].peak_versions
        if want_parameters and schedule.layout.stage_ranks[stage_id][0] == rank:
            result.parameters.update(_named_parameters(stage))
    result.peak_memory_bytes = (torch.cuda.max_memory_allocated(device) if device.type == "cuda"
                                else peak_rss_bytes())
    return result


def _named_parameters(stage: StageRuntime) -> Mapping[str, Tensor]:
    start = stage.block_range[0]
    named = {}
    for name, param in stage.module.named_parameters():
        index, _, rest = name.partition(".")
        named[f"{start + int(index)}.{rest}"] = param.detach().cpu().clone()
    return named


def peak_rss_bytes() -> int:
    """Peak resident memory of this process (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)
