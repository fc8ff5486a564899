"""Predicted peak memory per rank of a plan: model state, weight versions, activations, buffers.

Everything is read off the profile and the schedule the plan builds (one representation: the
same action lists the simulator times and the runtime runs), never off per-schedule formulas.
For a rank hosting stages ``S`` (its chunks, the V's two halves, a replica, in each of ``N``
parallel pipelines), with ``|w_s|`` the parameter bytes of stage ``s``, the parts that do not
change during a run::

    parameters       N * sum |w_s|                 (+ sum |w_s| for AvgPipe's reference model)
    optimizer_state  N * sum (state of s)          the profile's measured optimizer_bytes when
                                                    it was profiled with this optimizer, else
                                                    k |w_s|: k = 0 SGD, 1 SGD+momentum/RMSprop/
                                                    Adagrad, 2 Adam/AdamW (their two moments)
    weight_versions  sum (copies_s * |w_s|)        module replicas holding other versions
                                                    (stashing, 2BW, vertical sync, WPipe's G0,
                                                    PipeOptim's predictions)

and the parts that do, taken at the moment of the rank's peak, found by walking its program
(:mod:`.memory_timeline`)::

    gradients        the weight gradients present (from the first backward after an update
                     to the next update)
    activations      what forwards left for their backwards: per micro-batch and stage the
                     profile's saved bytes plus the stage's output (a recomputed or
                     predicted forward: its input only), scaled to the plan's micro-batch;
                     split backwards keep them until their W, with the output gradients
                     the W needs (``pending_bytes``, from the I) and the parameter
                     holders' outputs autograd does not save (``recorded_bytes``, from the F)
    buffers          messages in flight: received activations and gradients from when the
                     receive is posted (the runtime posts two ahead) to their use, sent input
                     gradients until a later receive proves them delivered
    workspace        the running backward's own tensors: the largest of its blocks'
                     ``peak_memory_bytes`` less what the block keeps (saved tensors, output,
                     gradients), plus what a recomputing backward rebuilds

``|w_s|`` counts a tied parameter (``Profile.ties``: tied word embeddings) once when the stage
holds several of its blocks, and once on every holding stage when the plan splits them: the
runtime gives each holder a copy, with its own gradient and optimizer state
(``runtime/execution/ties.py``), so the split costs one more of each.

``copies_s`` is what :mod:`pipeweave.runtime.execution.weights` allocates: the simulator's
weight versions of the stage (live + every older version still named + transient
predictions, ``sim.metrics.weight_versions``) less the live one, plus one where a forward at
the live version has an update of the stage before its backward: the runtime runs that
forward on a copy (autograd keeps the tensors it ran on; the update is in place). The
runtime builds replicas once and keeps them, so the peak count holds for the whole run.

``docs/memory.md`` compares the total with the peak of live tensor bytes measured at the
allocator (``Job.track_allocations``) for every schedule.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..ir import GRADIENT_OPS, Op, Schedule
from ..profiler import Profile
from ..schedules import get_info
from ..sim.metrics import weight_versions
from .memory_shape import shape_analysis
from .memory_timeline import StageBytes, peak_moments_of
from .plan import Plan

__all__ = ["RankMemory", "predicted_memory", "OPTIMIZER_STATE", "optimizer_state_bytes",
           "stage_activation_bytes", "weight_copies"]

OPTIMIZER_STATE: dict[str, int] = {
    "sgd": 0, "sgd-momentum": 1, "rmsprop": 1, "adagrad": 1, "adam": 2, "adamw": 2,
}
"""State tensors per parameter of each optimizer (torch.optim): plain SGD keeps none, SGD
with momentum one buffer, RMSprop its square average, Adagrad its sum, Adam and AdamW their
first and second moments."""


@dataclass(frozen=True)
class RankMemory:
    """Predicted peak bytes of one rank, by kind (module docstring)."""

    parameters: float
    gradients: float
    optimizer_state: float
    weight_versions: float
    activations: float
    buffers: float
    workspace: float = 0.0

    @property
    def total(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))


def predicted_memory(profile: Profile, plan: Plan, *, batch_size: int, optimizer: str = "adam",
                     iterations: int | None = None) -> list[RankMemory]:
    """Peak memory of every rank of ``plan`` (rank order), per kind (module docstring).

    ``batch_size``: samples per iteration and pipeline (the plan's micro-batch holds
    ``batch_size / microbatches`` of them; the profile's bytes are scaled from its own
    ``batch_size``). ``optimizer``: a name of :data:`OPTIMIZER_STATE`. ``iterations``: how
    many iterations of the schedule to lay out (default: 1 for a flush schedule, whose
    iterations repeat; for an asynchronous one the fewest, at least 3, that hold ``2 x depth``
    micro-batches: its steady state, and as many copies and activations as any longer run).
    Linear in the schedule's length: a few seconds for 64 ranks x 128 micro-batches, of
    which a new partition of a shape already analysed (:mod:`.memory_shape`) pays only the
    bytes-weighted walk.
    """
    if profile.num_blocks != plan.num_blocks:
        raise ValueError(f"the profile has {profile.num_blocks} blocks but the plan covers "
                         f"{plan.num_blocks}; profile the model the plan was made for")
    if optimizer not in OPTIMIZER_STATE:
        raise ValueError(f"optimizer {optimizer!r} has no known state size; choose one of "
                         f"{', '.join(sorted(OPTIMIZER_STATE))}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if batch_size % plan.microbatches:
        raise ValueError(f"batch_size {batch_size} is not divisible by microbatches="
                         f"{plan.microbatches}; give a multiple of {plan.microbatches}")
    if iterations is None:
        iterations = 1 if get_info(plan.schedule).synchronous else max(
            3, -(-2 * plan.depth // plan.microbatches))
    # lowered, as the runtime runs it: an I directly followed by its W is one B there; the
    # analysis that needs only the action lists is shared by every partition of the shape
    analysis = shape_analysis(plan.schedule, plan.shape(iterations))
    schedule = analysis.schedule
    if schedule.num_stages != len(plan.stages):
        raise ValueError(f"schedule {plan.schedule!r} lays out {schedule.num_stages} stages but "
                         f"the plan has {len(plan.stages)}; set the plan's chunks to "
                         f"{schedule.num_stages // plan.depth}")
    scale = _scale(profile, batch_size // plan.microbatches)
    weights = [profile.stage_parameter_bytes(a, e) for a, e in plan.stages]
    held = stage_activation_bytes(profile, plan, scale)
    split = analysis.split
    stages = [StageBytes(gradients=weights[s], activations=held[s],
                         inputs=scale * _input_bytes(profile, a),
                         pending=scale * _pending_bytes(profile, plan, s) if s in split else 0.0,
                         recorded=(scale * sum(b.recorded_bytes for b in profile.blocks[a:e])
                                   if s in split else 0.0),
                         workspace=scale * _workspace(profile, a, e),
                         received=scale * _input_bytes(profile, a) if s > 0 else 0.0,
                         sent=(scale * profile.blocks[e - 1].output_bytes
                               if s < len(plan.stages) - 1 else 0.0))
              for s, (a, e) in enumerate(plan.stages)]
    recompute = [plan.recompute_stage(s) for s in range(len(plan.stages))]
    graphless = analysis.graphless(recompute, plan.semantics.backward or "recompute")
    moments = peak_moments_of(analysis.timelines, stages, graphless)
    copies = analysis.copies(plan.semantics.backward == "graph")
    averages = analysis.averages
    state = optimizer_state_bytes(profile, plan, optimizer)
    n = schedule.pipelines
    ranks = []
    for rank, moment in enumerate(moments):
        hosted = schedule.layout.stages_of(rank)
        own = sum(weights[s] for s in hosted)
        ranks.append(RankMemory(
            parameters=n * own + (own if averages else 0.0),
            gradients=moment.gradients,
            optimizer_state=n * sum(state[s] for s in hosted),
            weight_versions=sum(copies[s] * weights[s] for s in hosted),
            activations=moment.activations,
            buffers=moment.buffers,
            workspace=moment.workspace,
        ))
    return ranks


def optimizer_state_bytes(profile: Profile, plan: Plan, optimizer: str) -> list[float]:
    """Per stage: the optimizer's state bytes, as measured by the profiler when it profiled
    with ``optimizer`` (Adam's moments plus its per-tensor step counters), else counted."""
    measured = profile.metadata.get("optimizer") == optimizer
    per_block = [b.optimizer_bytes if measured else OPTIMIZER_STATE[optimizer] * b.parameter_bytes
                 for b in profile.blocks]
    return [sum(per_block[a:e]) * _held_share(profile, a, e) for a, e in plan.stages]


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


def weight_copies(schedule: Schedule, *, keep_predicted: bool = False) -> list[int]:
    """Per stage: weight sets held besides the live parameters (module docstring)."""
    versions = weight_versions(schedule, keep_predicted=keep_predicted)
    stashing = _stashes_live(schedule)
    return [v - 1 + (1 if s in stashing else 0) for s, v in enumerate(versions)]


def _stashes_live(schedule: Schedule) -> set[int]:
    """The stages where some forward runs at the live version and an update of the stage
    comes before its backward (so the runtime copies the live weights for it)."""
    found: set[int] = set()
    for program in schedule.programs:
        live: dict[tuple[int, int], int] = {}
        # per (stage, pipeline): (micro-batch, piece) -> ran at the live version; and the
        # forwards an update has passed since
        pending: dict[tuple[int, int], dict[tuple[int | None, int], bool]] = {}
        passed: dict[tuple[int, int], set[tuple[int | None, int]]] = {}
        for op, stage, microbatch, piece, version, lookahead, pipeline in program:
            where = (stage, pipeline)
            now = live.setdefault(where, 0)
            waiting = pending.setdefault(where, {})
            if op is Op.STEP:
                live[where] = version if version is not None else now + 1
                passed[where] = set(waiting)
            elif op is Op.FORWARD and not lookahead:
                waiting[(microbatch, piece)] = version is None or version == now
            elif op in GRADIENT_OPS:
                for key in [k for k in ((microbatch, 0), (microbatch, 1), (microbatch, 2))
                            if k in waiting]:
                    if waiting.pop(key) and key in passed.get(where, ()):
                        found.add(stage)
    return found


def _pending_bytes(profile: Profile, plan: Plan, stage: int) -> float:
    """What a split backward keeps from its I to its W: the output gradients its parameter
    holders' weight gradients need, and the gradient it received (none on the last stage)."""
    start, end = plan.stages[stage]
    received = profile.blocks[end - 1].output_bytes if stage < len(plan.stages) - 1 else 0.0
    return received + sum(b.pending_bytes for b in profile.blocks[start:end])


def _workspace(profile: Profile, start: int, end: int) -> float:
    """The largest transient of the stage's blocks' backwards: a block's measured peak less
    what it keeps (saved tensors, output, weight gradients), 0 where the peak is unknown or
    only estimated (CPU profiles written before the profiler measured it)."""
    if profile.metadata.get("peak_memory") == "estimated":
        return 0.0
    stash = profile.stash_bytes
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

