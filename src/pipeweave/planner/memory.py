"""The memory model (:mod:`pipeweave.memory`) asked about a plan, with bytes read off a profile.

Everything is read off the profile and the schedule the plan builds (one representation: the
same action lists the simulator times and the runtime runs), never off per-schedule formulas.
This module only gathers the per-stage bytes from the profile; :mod:`pipeweave.memory` adds
them up (its docstrings give the formulas):

* weights ``|w_s|`` (``Profile.stage_parameter_bytes``): a tied parameter (``Profile.ties``:
  tied word embeddings) once when the stage holds several of its blocks, and once on every
  holding stage when the plan splits them: the runtime gives each holder a copy, with its own
  gradient and optimizer state (``runtime/execution/ties.py``);
* optimizer state: the profile's measured ``optimizer_bytes`` when it was profiled with this
  optimizer, else counted (:mod:`pipeweave.memory.optimizers`);
* activations per micro-batch and stage: the profile's saved bytes plus the stage's output (a
  recomputed or predicted forward: its input only), scaled to the plan's micro-batch; split
  backwards keep them until their W, with the output gradients the W needs
  (``pending_bytes``, from the I) and the parameter holders' outputs autograd does not save
  (``recorded_bytes``, from the F);
* messages: one received activation (the stage's input) and one sent (its output);
* workspace: the largest of the stage's blocks' ``peak_memory_bytes`` less what the block
  keeps (saved tensors, output, gradients), plus what a recomputing backward rebuilds;
* a tensor-parallel plan (``Plan.tp > 1``): every byte above as one of its ``tp`` processes
  holds it (:func:`.tp_costs.tp_profile`: the split linears' parameters, gradients,
  optimizer state and split activations ``1/tp``, the rest whole), by
  :func:`predicted_memory` and :func:`predicted_state`; the helpers below read the profile
  they are given.

``docs/memory.md`` compares the total with the peak of live tensor bytes measured at the
allocator (``Job.track_allocations``) for every schedule.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..memory import (OPTIMIZER_STATE, ModelState, RankMemory, Sharding, StageBytes,
                      StageWeights, check_optimizer, held_activations, model_state, rank_memory)
from ..memory import optimizer_state_bytes as counted_state
from ..profiler import Profile
from ..schedules import Shape, get_info, lowered_schedule
from .memory_shape import ShapeAnalysis, is_cached, shape_analysis
from .plan import Plan
from .profile_memo import kept
from .tp_costs import tp_profile

__all__ = ["RankMemory", "ModelState", "predicted_memory", "predicted_state", "OPTIMIZER_STATE",
           "optimizer_state_bytes", "stage_activation_bytes", "stage_weights", "plan_analysis",
           "plan_weight_copies", "held_microbatches", "plan_sharding",
           "reduction_bytes", "analysis_cached"]

def predicted_memory(profile: Profile, plan: Plan, *, batch_size: int,
                     optimizer: str | None = "adam",
                     iterations: int | None = None, copies_of: int = 1,
                     sharding: Sharding | None = None) -> list[RankMemory]:
    """Peak memory of every rank of ``plan`` (rank order), per kind (:mod:`pipeweave.memory`).

    ``batch_size``: samples per iteration and pipeline (the plan's micro-batch holds
    ``batch_size / microbatches`` of them; the profile's bytes are scaled from its own
    ``batch_size``). ``optimizer``: a name of :data:`OPTIMIZER_STATE`, or ``None``: the one
    the profile was made with (its ``optimizer_bytes`` as measured). ``iterations``: how
    many iterations of the schedule to lay out (:func:`plan_analysis`). Linear in the
    schedule's length (``copies_of``: ``plan`` is one of that many identical data-parallel
    copies, whose gradients its ``AR`` reduces over them; ``sharding``: how those copies hold
    each stage, default :func:`plan_sharding` of ``plan``). A few seconds for 64 ranks x 128 micro-batches, of which a new
    partition of a shape already analysed (:mod:`.memory_shape`) pays only the
    bytes-weighted walk.
    """
    _check_profile(profile, plan)
    profile = tp_profile(profile, plan.tp)
    if optimizer is not None:
        check_optimizer(optimizer)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if batch_size % plan.microbatches:
        raise ValueError(f"batch_size {batch_size} is not divisible by microbatches="
                         f"{plan.microbatches}; give a multiple of {plan.microbatches}")
    analysis = plan_analysis(plan, iterations)
    scale = _scale(profile, batch_size // plan.microbatches)
    reduced = [copies_of * len(ranks) for ranks in analysis.layout.stage_ranks]
    sharding = plan_sharding(plan) if sharding is None else sharding
    stages = _stage_bytes(profile, plan, scale, analysis.split, reduced, sharding)
    recompute = [plan.recompute_stage(s) for s in range(len(plan.stages))]
    moments = analysis.moments(stages, recompute, plan.semantics.backward or "recompute")
    state = _state(profile, plan, optimizer, analysis, sharding)
    return [rank_memory(fixed, moment) for fixed, moment in zip(state, moments)]


def predicted_state(profile: Profile, plan: Plan, *, optimizer: str = "adam",
                    iterations: int | None = None) -> list[ModelState]:
    """Per rank of ``plan``: the model state (parameters, all gradients, optimizer state,
    weight copies; :func:`pipeweave.memory.model_state`): what it holds before any
    activation, as ``train --memory-limit`` checks it."""
    _check_profile(profile, plan)
    check_optimizer(optimizer)
    profile = tp_profile(profile, plan.tp)
    return _state(profile, plan, optimizer, plan_analysis(plan, iterations))


def plan_analysis(plan: Plan, iterations: int | None = None) -> ShapeAnalysis:
    """The schedule of ``plan``, lowered as the runtime runs it (an I directly followed by its
    W is one B there), analysed once per shape (:mod:`.memory_shape`). ``iterations``: how
    many iterations to lay out (default: 1 for a flush schedule, whose iterations repeat; for
    an asynchronous one the fewest, at least 3, that hold ``2 x depth`` micro-batches: its
    steady state, and as many copies and activations as any longer run)."""
    if iterations is None:
        iterations = _iterations(plan.schedule, plan.depth, plan.microbatches)
    analysis = shape_analysis(plan.schedule, plan.shape(iterations))
    if analysis.num_stages != len(plan.stages):
        raise ValueError(f"schedule {plan.schedule!r} lays out {analysis.num_stages} "
                         f"stages but the plan has {len(plan.stages)}; set the plan's chunks to "
                         f"{analysis.num_stages // plan.depth}")
    return analysis


def analysis_cached(plan: Plan, iterations: int | None = None) -> bool:
    """Whether :func:`plan_analysis` of ``plan`` is at hand (:func:`.memory_shape.is_cached`)."""
    if iterations is None:
        iterations = _iterations(plan.schedule, plan.depth, plan.microbatches)
    return is_cached(plan.schedule, plan.shape(iterations))


def held_microbatches(schedule: str, ranks: int, microbatches: int) -> list[float]:
    """Per rank of ``schedule`` laid out on ``ranks`` ranks: the most micro-batches whose
    activations it holds at once (the model's walk, :func:`pipeweave.memory.held_activations`,
    of the schedule as :func:`plan_analysis` lays it out; a Slicer half counts 0.5)."""
    shape = Shape(stages=ranks, microbatches=microbatches,
                  iterations=_iterations(schedule, ranks, microbatches))
    lowered = lowered_schedule(schedule, shape)  # the actions: the walk of .held reads them
    counts, _ = held_activations(lowered, [1.0] * lowered.num_stages)
    return counts


def _iterations(schedule: str, depth: int, microbatches: int) -> int:
    return 1 if get_info(schedule).synchronous else max(3, -(-2 * depth // microbatches))


def plan_weight_copies(plan: Plan, iterations: int | None = None) -> list[int]:
    """Per stage of ``plan``: the weight sets held besides the live ones
    (:func:`pipeweave.memory.weight_copies` of its lowered schedule)."""
    return plan_analysis(plan, iterations).copies(plan.semantics.backward == "graph")


def stage_weights(profile: Profile, plan: Plan) -> list[StageWeights]:
    """Per stage: the parameter bytes it holds (ties once), all trainable, and its largest
    block's (kept per split, :mod:`.profile_memo`)."""
    return list(kept(profile, ("weights", plan.stages), lambda: [
        StageWeights(parameters=w, trainable=w,
                     largest_block=max((b.parameter_bytes for b in profile.blocks[a:e]),
                                       default=0.0))
        for w, (a, e) in zip((profile.stage_parameter_bytes(a, e) for a, e in plan.stages),
                             plan.stages)]))


def plan_sharding(plan: Plan) -> Sharding:
    """How ``plan`` holds its stages over their data-parallel ranks (``Plan.shard``)."""
    return Sharding(mode=plan.shard, ways=plan.width)


def _state(profile: Profile, plan: Plan, optimizer: str | None,
           analysis: ShapeAnalysis, sharding: Sharding | None = None) -> list[ModelState]:
    layout = analysis.layout
    return model_state(stage_weights(profile, plan), optimizer_state_bytes(profile, plan, optimizer),
                       [layout.stages_of(r) for r in range(layout.num_ranks)],
                       pipelines=analysis.pipelines, reference=analysis.averages,
                       copies=analysis.copies(plan.semantics.backward == "graph"),
                       sharding=plan_sharding(plan) if sharding is None else sharding)


def reduction_bytes(weights: StageWeights, ways: int, sharding: Sharding) -> float:
    """What a stage's gradient reduction over ``ways`` ranks allocates while it runs
    (:attr:`pipeweave.memory.StageBytes.reduction`): the runtime's all-reduce gathers every
    rank's flattened gradients and sums them in rank order, ``(D + 2) g``; FSDP2's
    reduce-scatter, block by block, copies a block's gradient into its input and returns a
    ``1/D`` shard, ``(1 + 1/D)`` of the largest block's."""
    if ways < 2:
        return 0.0
    if sharding.sharded:
        return (weights.largest_block or weights.trainable) * (1.0 + 1.0 / ways)
    return weights.trainable * (ways + 2)


def _stage_bytes(profile: Profile, plan: Plan, scale: float, split: frozenset[int],
                 reduced: Sequence[int], sharding: Sharding) -> list[StageBytes]:
    """Per stage: what a micro-batch costs there (:class:`pipeweave.memory.StageBytes`);
    ``reduced``: per stage, the ranks its gradients are reduced over."""
    weights = [profile.stage_parameter_bytes(a, e) for a, e in plan.stages]
    held_weights = stage_weights(profile, plan)
    held = stage_activation_bytes(profile, plan, scale)
    last = len(plan.stages) - 1
    stash = profile.stash_bytes  # a tuple built per call: once for every stage
    return [StageBytes(gradients=weights[s], activations=held[s],
                       inputs=scale * _input_bytes(profile, a),
                       pending=scale * _pending_bytes(profile, plan, s) if s in split else 0.0,
                       recorded=(scale * sum(b.recorded_bytes for b in profile.blocks[a:e])
                                 if s in split else 0.0),
                       workspace=scale * _workspace(profile, a, e, stash),
                       received=scale * _input_bytes(profile, a) if s > 0 else 0.0,
                       sent=scale * profile.blocks[e - 1].output_bytes if s < last else 0.0,
                       reduction=reduction_bytes(held_weights[s], reduced[s], sharding))
            for s, (a, e) in enumerate(plan.stages)]


def _check_profile(profile: Profile, plan: Plan) -> None:
    if profile.num_blocks != plan.num_blocks:
        raise ValueError(f"the profile has {profile.num_blocks} blocks but the plan covers "
                         f"{plan.num_blocks}; profile the model the plan was made for")


def optimizer_state_bytes(profile: Profile, plan: Plan, optimizer: str | None) -> list[float]:
    """Per stage: the optimizer's state bytes, as measured by the profiler when it profiled
    with ``optimizer`` (Adam's moments plus its per-tensor step counters) or ``optimizer`` is
    ``None``, else counted (:func:`pipeweave.memory.optimizer_state_bytes`; a profile records
    no tensor count, so the step counters, 4 bytes a tensor, are left out)."""
    if optimizer is not None:
        check_optimizer(optimizer)
    return list(kept(profile, ("optimizer", optimizer, plan.stages),
                     lambda: _optimizer_state(profile, plan.stages, optimizer)))


def _optimizer_state(profile: Profile, stages: Sequence[tuple[int, int]],
                     optimizer: str | None) -> list[float]:
    measured = optimizer is None or profile.metadata.get("optimizer") == optimizer
    per_block = [b.optimizer_bytes if measured or optimizer is None
                 else counted_state(optimizer, b.parameter_bytes)
                 for b in profile.blocks]
    return [sum(per_block[a:e]) * _held_share(profile, a, e) for a, e in stages]


def _held_share(profile: Profile, start: int, end: int) -> float:
    """The share of the blocks' summed parameter bytes the stage holds: below 1 when it holds
    several blocks of a tie (one parameter, one state; :meth:`Profile.shared_bytes`)."""
    total = sum(b.parameter_bytes for b in profile.blocks[start:end])
    return profile.stage_parameter_bytes(start, end) / total if total > 0 else 1.0


def stage_activation_bytes(profile: Profile, plan: Plan, scale: float = 1.0) -> list[float]:
    """Bytes one micro-batch leaves on each stage from its forward to its backward: the
    blocks' saved tensors and the stage's output (the root its backward starts from; on the
    last stage that is the loss, a scalar), or, for a recomputed stage, only its input."""
    blocks, stash = profile.blocks, profile.stash_bytes
    last = len(plan.stages) - 1
    held = []
    for stage, (start, end) in enumerate(plan.stages):
        output = blocks[end - 1].output_bytes if stage < last else 0.0
        if plan.recompute_stage(stage):
            held.append(scale * _input_bytes(profile, start))
        else:
            held.append(scale * (sum(stash[start:end]) + output))
    return held


def _pending_bytes(profile: Profile, plan: Plan, stage: int) -> float:
    """What a split backward keeps from its I to its W: the output gradients its parameter
    holders' weight gradients need, and the gradient it received (none on the last stage)."""
    start, end = plan.stages[stage]
    received = profile.blocks[end - 1].output_bytes if stage < len(plan.stages) - 1 else 0.0
    return received + sum(b.pending_bytes for b in profile.blocks[start:end])


def _workspace(profile: Profile, start: int, end: int, stash: Sequence[float]) -> float:
    """The largest transient of the stage's blocks' backwards: a block's measured peak less
    what it keeps (saved tensors, output, weight gradients), 0 where the peak is unknown or
    only estimated (CPU profiles written before the profiler measured it)."""
    if profile.metadata.get("peak_memory") == "estimated":
        return 0.0
    return max((max(0.0, b.peak_memory_bytes - stash[i] - b.output_bytes - b.parameter_bytes)
                for i, b in enumerate(profile.blocks[start:end], start)
                if b.peak_memory_bytes > 0), default=0.0)


def _input_bytes(profile: Profile, start: int) -> float:
    return profile.input_bytes if start == 0 else profile.blocks[start - 1].output_bytes


def _scale(profile: Profile, microbatch_rows: int) -> float:
    """Factor from the profile's micro-batch to the plan's (1 when the profile's is unknown)."""
    if profile.batch_size is None:
        return 1.0
    return microbatch_rows / profile.batch_size

