"""Building one rank's part of a job and running it; results as plain data.

:func:`build_rank` turns a :class:`Job` into the stages and optimizers a rank owns;
:func:`make_schedule` produces the lowered schedule every rank interprets (the same pure
function on every rank, so no schedule travels between processes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch._subclasses.fake_tensor import (DataDependentOutputException,
                                           DynamicOutputShapeException, FakeTensorMode,
                                           UnsupportedFakeTensorException,
                                           UnsupportedOperatorException)

from ...ir import Op, Schedule
from ...ir.updates import update_sizes
from ...models import ModelSpec
from ...models.materialize import meta_copy
from ...precision import cast_module
from ...schedules import build_schedule, get_info, lowered_schedule
from ..job import Job
from ...planner.plan import Plan
from .elastic_averaging import ElasticAverager
from .stage import HeldActivations, StagePlace, StageRuntime, StageTraining
from .weights import StageWeights, VersionRules

if TYPE_CHECKING:
    from .sharding import StageSharding
    from .tensor_parallel import RankMesh

__all__ = ["RankParts", "PipelineParts", "build_rank", "make_schedule", "check_model_fits_plan",
           "preflight", "GroupOf"]

GroupOf = Callable[[Sequence[int]], Any]
"""The process group of a stage's ranks (``DistTransport.group``), for FSDP2."""

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
    return lowered_schedule(plan.schedule, plan.shape(steps))


def check_model_fits_plan(spec: ModelSpec, plan: Plan) -> None:
    if len(spec.blocks) != plan.num_blocks:
        raise ValueError(
            f"plan covers {plan.num_blocks} blocks but model {spec.name!r} has "
            f"{len(spec.blocks)}; make the plan for this model (e.g. Plan.uniform("
            f"{len(spec.blocks)}, depth))"
        )


def preflight(spec: ModelSpec, plan: Plan, inputs: Tensor, *, precision: str = "full") -> None:
    """Run one sample through the stages in order, before any process starts, from shapes.

    A stage that cannot take its predecessor's output (a shape or dtype mismatch between
    stages) is reported with both stages' block ranges and the shape that was passed. It runs
    under ``FakeTensorMode`` on meta copies of the blocks: no value is computed and nothing is
    allocated, whether the blocks come on the meta device or real. ``bf16`` casts the stages'
    own copies only and ``bf16-mixed``'s autocast acts on real devices, so it runs in the
    model's dtype here.
    """
    check_model_fits_plan(spec, plan)
    if inputs.shape[0] % plan.microbatches:
        raise ValueError(
            f"batch size {inputs.shape[0]} is not divisible by microbatches={plan.microbatches}; "
            f"use a batch size that is a multiple of {plan.microbatches}"
        )
    blocks = meta_copy(spec.blocks)  # the spec's own blocks keep no trace of the check
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    for block in blocks:
        block.eval()  # no dropout
    with mode, torch.no_grad():
        x = mode.from_tensor(inputs[:1].to("meta"))
        for index, (start, end) in enumerate(plan.stages):
            for block_index in range(start, end):
                try:
                    x = blocks[block_index](x)
                except (DataDependentOutputException, DynamicOutputShapeException,
                        UnsupportedFakeTensorException, UnsupportedOperatorException):
                    return  # a block that needs values: its shapes are checked when it runs
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


@dataclass(frozen=True)
class PipelineParts:
    """What one rank owns for one pipeline: its stages, their optimizers and weight versions."""

    stages: dict[int, StageRuntime]
    optimizers: dict[int, torch.optim.Optimizer]
    weights: dict[int, StageWeights]


@dataclass(frozen=True)
class RankParts:
    """What one rank owns: per pipeline (one, or AvgPipe's N parallel pipelines, each with its
    own copy of this rank's stages) its :class:`PipelineParts`, and what the pipelines share."""

    pipelines: tuple[PipelineParts, ...]
    averagers: dict[int, ElasticAverager] = field(default_factory=dict)
    """Per stage, the reference model of the N parallel pipelines (AvgPipe)."""
    tied_to: dict[str, str] = field(default_factory=dict)
    """Global name of every later use of a tied parameter -> its first use's (``spec.tied``):
    checkpoints store the weight once, under the first name, and restore every copy from it."""

    def pipeline(self, index: int) -> PipelineParts:
        return self.pipelines[index]

    @property
    def stages(self) -> dict[int, StageRuntime]:
        """Pipeline 0's stages (the only pipeline but with AvgPipe)."""
        return self.pipelines[0].stages

    @property
    def optimizers(self) -> dict[int, torch.optim.Optimizer]:
        return self.pipelines[0].optimizers

    @property
    def weights(self) -> dict[int, StageWeights]:
        return self.pipelines[0].weights


def build_rank(job: Job, rank: int, schedule: Schedule, device: torch.device,
               spec: ModelSpec | None = None, group_of: GroupOf | None = None,
               mesh: "RankMesh | None" = None) -> RankParts:
    """Stages and optimizers for the stages ``rank`` hosts: each stage's blocks made real on
    ``device`` (from the meta device, initialised per block) or deep-copied there
    (:meth:`ModelSpec.stage_blocks`); no other block is built.

    Every stage is in train mode, whatever mode its blocks came in (a ``from_pretrained``
    model comes in eval mode): dropout and batch statistics are on while training, in both
    executors alike.

    With N parallel pipelines (AvgPipe) every pipeline gets its own copies, all starting from
    the same initial weights, and every stage an :class:`ElasticAverager` holding the reference.

    With ``Plan.shard`` each stage is wrapped with FSDP2 over the process group ``group_of``
    gives for its ranks (:mod:`.sharding`) before its optimizer is built on the shards.

    With ``Plan.tp`` (``mesh`` given) each stage's layers are first split over the mesh's
    ``tp`` dimension (:mod:`.tensor_parallel`); FSDP2 then shards over ``dp`` on the
    ``(dp, tp)`` mesh.
    """
    spec = job.model() if spec is None else spec
    check_model_fits_plan(spec, job.plan)
    sizes = update_sizes(schedule)
    main = RankParts(tuple(_build_pipeline(job, rank, schedule, device, spec, p, sizes,
                                           (group_of, mesh))
                           for p in range(schedule.pipelines)),
                     tied_to={later: group[0] for group in spec.tied for later in group[1:]})
    if any(a.op is Op.AVERAGE for a in schedule.programs[rank]):
        semantics = job.plan.semantics
        for stage, runtime in main.stages.items():
            main.averagers[stage] = ElasticAverager(
                stage=stage, pipelines=schedule.pipelines, initial=runtime.module,
                alpha=semantics.alpha, order=semantics.order)
    return main


def _build_pipeline(job: Job, rank: int, schedule: Schedule, device: torch.device,
                    spec: ModelSpec, pipeline: int,
                    sizes: Mapping[tuple[int, int], int],
                    groups: "tuple[GroupOf | None, RankMesh | None]" = (None, None)
                    ) -> PipelineParts:
    """``sizes``: micro-batches per update of every (stage, pipeline), ``update_sizes``;
    ``groups``: :func:`build_rank`'s ``group_of`` and ``mesh``."""
    last = schedule.num_stages - 1
    last_size = sizes[(last, pipeline)]
    stages: dict[int, StageRuntime] = {}
    optimizers: dict[int, torch.optim.Optimizer] = {}
    weights: dict[int, StageWeights] = {}
    held = HeldActivations()  # one count over the rank's stages
    backward = job.plan.semantics.backward_mode
    for stage in schedule.layout.stages_of(rank):
        start, end = job.plan.stages[stage]
        module = cast_module(nn.Sequential(*spec.stage_blocks(start, end, device)), job.precision)
        module.train()  # whatever mode the blocks came in (see the docstring)
        if groups[1] is not None:
            from .tensor_parallel import parallelize_stage  # DTensor loads only for tp runs

            parallelize_stage(module, groups[1].tp_mesh)
        sharding = _sharded(job, module, stage, schedule, rank, device, groups)
        stages[stage] = StageRuntime(
            place=StagePlace(stage, (start, end), is_first=stage == 0, is_last=stage == last),
            blocks=module, loss_fn=spec.loss_fn, held=held, training=StageTraining(
                recompute=job.plan.recompute_stage(stage),
                loss_scale=schedule.microbatches / last_size,
                update_scale=last_size / sizes[(stage, pipeline)],
                split_backward=any(a.op is Op.BACKWARD_INPUT and a.stage == stage
                                   for a in schedule.programs[rank]),
                precision=job.precision))
        stages[stage].sharding = sharding
        optimizers[stage] = job.optimizer(module.parameters())
        weights[stage] = StageWeights(
            stage=stage, module=module, optimizer=optimizers[stage], program=schedule.programs[rank],
            rules=VersionRules(recompute=job.plan.recompute_stage(stage), backward=backward,
                               prediction=get_info(job.plan.schedule).prediction),
            pipeline=pipeline,
        )
    return PipelineParts(stages, optimizers, weights)


def _sharded(job: Job, module: nn.Module, stage: int, schedule: Schedule, rank: int,
             device: torch.device,
             groups: "tuple[GroupOf | None, RankMesh | None]") -> "StageSharding | None":
    """FSDP2 over the stage's ranks when the plan shards (None: replicated as it is)."""
    if job.plan.shard == "none":
        return None
    group_of, mesh = groups
    if group_of is None:
        raise ValueError(f"--shard {job.plan.shard} needs a process group per stage: run it "
                         f"with the distributed executor (--executor processes, launch_local)")
    from .sharding import shard_stage  # FSDP2 loads only for sharded runs

    return shard_stage(module, group_of(schedule.layout.stage_ranks[stage]), job.plan.shard,
                       device_type=device.type, program=schedule.programs[rank], stage=stage,
                       mesh=mesh.dp_mesh if mesh is not None else None)
