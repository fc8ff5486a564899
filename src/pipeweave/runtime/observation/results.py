"""What a rank reports after a run, as plain picklable data, and how it is collected.

:class:`RankResult` is what both executors return per rank (losses, timeline, memory, weight
versions, final parameters under their global names); a failed run's error carries the
results the ranks had so far (:func:`attach_partial`, :func:`partial_results`);
:func:`merged_parameters` puts every rank's final parameters together.
"""

from __future__ import annotations

import resource
from contextlib import nullcontext
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ...ir import Schedule
from ...models.naming import global_names
from ..communication.sharded import full_value

if TYPE_CHECKING:
    from ..execution.parts import RankParts
    from ..execution.stage import StageRuntime

__all__ = ["RankResult", "collect_result", "merged_parameters", "owned_parameters", "attach_partial",
           "partial_results", "peak_rss_bytes", "PARTIAL"]


@dataclass
class RankResult:
    """What a rank reports after a run (plain data, picklable)."""

    rank: int
    losses: dict[int, float] = field(default_factory=dict)
    """Weighted loss per micro-batch (ranks hosting the last stage)."""
    records: list[tuple[int, str, float, float]] = field(default_factory=list)
    peak_memory_bytes: int = 0
    """CUDA: ``max_memory_allocated``; CPU: the process's peak RSS (interpreter and libraries
    included)."""
    peak_allocated_bytes: int = 0
    """With ``Job.track_allocations``: most bytes of live tensors from the rank's model
    construction to the end of the run, measured at the allocator (observation/allocations.py);
    0 otherwise."""
    peak_activation_bytes: int = 0
    """With ``Job.count_activations``: most activation bytes the rank held at once between
    forwards and backwards (:class:`~.memory.ActivationMeter`; 0 when not counted)."""
    state_bytes: int = 0
    """With ``Job.count_activations``: parameters + gradients + optimizer state the rank holds
    at the end (:func:`~.memory.state_bytes`; 0 when not counted)."""
    peak_stashed_microbatches: int = 0
    """Most micro-batches whose activations the rank held at once, over all its stages (a
    split backward's from its F until its W); the simulator's ``peak_activations``."""
    parameters: dict[str, Tensor] = field(default_factory=dict)
    """``"<block>.<name>" -> tensor`` for the blocks this rank owns (first replica only); with
    parallel pipelines, the reference model's values."""
    snapshots: dict[int, dict[str, Tensor]] = field(default_factory=dict)
    """With ``Job.eval_every``: step -> the ``parameters`` (as above) right after that step
    (:mod:`..checkpoint.snapshots`), for the held-out loss the launcher computes."""
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
    grad_norms: list[float] = field(default_factory=list)
    """With ``Job.clip_grad_norm``: the global gradient norm before clipping, per iteration
    (the same on every rank); with a global check (zb-h2 ``post_validation``), also without
    clipping (NaN where a gradient was not finite)."""
    redone_updates: list[int] = field(default_factory=list)
    """With a global check after the update (zb-h2 ``post_validation=true``): the updates this
    rank redid clipped, or skipped for a non-finite gradient, by version."""
    undone_updates: list[int] = field(default_factory=list)
    """Of ``redone_updates``, those the rank had made optimistically (on the partial check)
    and restored (parameters and optimizer state as captured before the step) first."""
    advance_log: list[dict[str, Any]] = field(default_factory=list)
    """AvgPipe's online controller, per measured step: the time and memory all ranks agreed on
    and the decision (see runtime/advance/online.py); the same on every rank."""


PARTIAL = "pipeweave_partial_results"
"""Attribute of an exception raised by a run: the :class:`RankResult` s of the ranks that
recorded what they had done when it stopped (losses, timeline), for the outputs of a failed
or interrupted run."""


def merged_parameters(results: Sequence[RankResult]) -> dict[str, Tensor]:
    """Every rank's final parameters (``Job.return_parameters``) in one mapping, by global name
    (``"<block>.<name>"``): the whole trained model's weights."""
    merged: dict[str, Tensor] = {}
    for result in results:
        merged.update(result.parameters)
    return merged


def attach_partial(error: BaseException, *results: RankResult) -> None:
    """Add ``results`` to ``error`` (:data:`PARTIAL`)."""
    setattr(error, PARTIAL, [*getattr(error, PARTIAL, []), *results])


def partial_results(error: BaseException) -> list[RankResult]:
    return list(getattr(error, PARTIAL, []))


def collect_result(rank: int, parts: RankParts, schedule: Schedule, *, records: list[tuple[int, str, float, float]],
                   want_parameters: bool, wall: float, device: torch.device,
                   want_losses: bool = True) -> RankResult:
    """``want_losses`` False: without the losses (the journal sends only the new ones)."""
    result = RankResult(rank=rank, records=records, wall_seconds=wall)
    for stage_id, stage in parts.stages.items():
        if want_losses:
            result.losses.update(stage.losses)
        result.peak_stashed_microbatches = max(result.peak_stashed_microbatches, stage.held.peak)
        weights = parts.weights[stage_id]
        result.peak_weight_versions[stage_id] = weights.peak_versions
        result.peak_weight_copies[stage_id] = weights.peak_copies
        result.weight_replicas[stage_id] = weights.replicas.allocations
        result.weight_bytes_copied[stage_id] = weights.replicas.bytes_copied
        result.updates[stage_id] = weights.live_version
        result.prediction_seconds[stage_id] = weights.prediction_seconds
    if want_parameters:
        result.parameters = owned_parameters(rank, parts, schedule)
    for index, other in enumerate(parts.pipelines[1:], start=1):
        for stage in other.stages.values():
            if want_losses:
                result.pipeline_losses.setdefault(index, {}).update(stage.losses)
    result.peak_memory_bytes = (torch.cuda.max_memory_allocated(device) if device.type == "cuda"
                                else peak_rss_bytes())
    return result


def owned_parameters(rank: int, parts: RankParts, schedule: Schedule) -> dict[str, Tensor]:
    """CPU copies of the parameters of the stages ``rank`` holds the first replica of, by
    global name; with parallel pipelines, the reference model's values."""
    owned: dict[str, Tensor] = {}
    for stage_id, stage in parts.stages.items():
        first = schedule.layout.stage_ranks[stage_id][0] == rank
        if first or stage.sharding is not None:  # every rank of a sharded stage gathers
            averager = parts.averagers.get(stage_id)
            with stage.sharding.gathered() if stage.sharding is not None else nullcontext():
                named = _named_parameters(
                    stage, averager.reference_parameters() if averager is not None else None)
            if first:
                owned.update(named)
    return owned


def _named_parameters(stage: StageRuntime,
                      values: Mapping[str, Tensor] | None = None) -> Mapping[str, Tensor]:
    """Global names (:mod:`pipeweave.models.naming`) of the stage's parameters, or of
    ``values`` (the same stage-local names), to CPU copies."""
    source = values.items() if values is not None else stage.module.named_parameters()
    return {name: full_value(param.detach()).cpu().clone()
            for name, param in global_names(source, stage.block_range[0])}


def peak_rss_bytes() -> int:
    """Peak resident memory of this process (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)
