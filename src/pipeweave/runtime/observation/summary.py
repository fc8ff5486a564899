"""From per-rank results to the numbers a run reports (DESIGN.md "Measures").

* throughput — samples/s over the steady-state iterations: the first iteration (warm-up,
  allocator and thread-pool start-up) is excluded when there are at least three;
* pipeline efficiency — busy F/B time over all ranks / (ranks x wall time of the same window);
* bubble fraction — 1 - efficiency;
* peak memory — per rank: CUDA ``max_memory_allocated`` on GPU, peak RSS on CPU;
* counted memory — per rank, with ``Job.count_activations``: the peak activation bytes held
  between forwards and backwards and the model state bytes (the same on CPU and GPU);
* bytes sent — per rank: activations and gradients sent point-to-point (``RankResult.bytes_sent``);
* AvgPipe — the advance per step, the online controller's log (time and counted memory per
  measured step, its decisions) and the memory limit (runtime/advance/online.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ...ir import Op, parse_action
from .timeline import Record, efficiency
from .results import RankResult

__all__ = ["TrainSummary", "summarize", "iteration_end_times", "iteration_losses"]


@dataclass(frozen=True)
class TrainSummary:
    schedule: str
    world_size: int
    steps: int
    batch_size: int
    microbatches: int
    samples_per_second: float
    final_loss: float
    losses: list[float]
    bubble_fraction: float
    pipeline_efficiency: float
    peak_memory_bytes: list[int]
    peak_stashed_microbatches: list[int]
    wall_seconds: float
    iteration_end_s: list[float] = field(default_factory=list)
    first_step: int = 0
    """Steps restored from a checkpoint (resumed run): they have losses but no timings."""
    bytes_sent: list[int] = field(default_factory=list)
    """Per rank: bytes of activations and gradients sent to other ranks (with ``--apc``, about
    half for float32)."""

    advance_per_step: list[int] = field(default_factory=list)
    """AvgPipe: the advance each step ran with (fixed, or chosen by the online controller)."""
    advance_log: list[dict[str, Any]] = field(default_factory=list)
    """AvgPipe's online controller, per measured step: time, memory, decision."""
    memory_limit: float | None = None
    """The memory limit per device the run was given (``--memory-limit``), if any."""
    peak_activation_bytes: list[int] = field(default_factory=list)
    """Per rank: most activation bytes held at once, counted (``Job.count_activations``;
    zeros when not counted)."""
    state_bytes: list[int] = field(default_factory=list)
    """Per rank: parameters + gradients + optimizer state, counted (as above)."""
    precision: str = "full"
    """``full``, ``bf16-mixed`` or ``bf16`` (pipeweave.precision)."""
    eval_losses: dict[int, float] = field(default_factory=dict)
    """Step -> held-out loss after that step (``--eval-every``; observation/held_out.py)."""
    status: str = "completed"
    """``completed``, ``failed`` (a rank raised; the summary covers the steps every rank
    finished) or ``interrupted`` (Ctrl-C)."""
    error: str | None = None
    """Why a failed or interrupted run stopped, in one line."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def iteration_losses(results: Sequence[RankResult], microbatches: int) -> list[float]:
    """Mean loss per iteration, summed from the last stage's weighted micro-batch losses."""
    per_microbatch: dict[int, float] = {}
    for result in results:
        per_microbatch.update(result.losses)
    if not per_microbatch:
        return []
    iterations = (max(per_microbatch) // microbatches) + 1
    totals = [0.0] * iterations
    for microbatch, value in sorted(per_microbatch.items()):
        totals[microbatch // microbatches] += value
    return totals


def iteration_end_times(records: Sequence[Record], microbatches: int, steps: int) -> list[float]:
    """When each iteration's last backward or update finished (seconds since the origin)."""
    ends = [0.0] * steps
    for _, text, _, end in records:
        action = parse_action(text)
        if action.op is Op.BACKWARD and action.microbatch is not None:
            k = action.microbatch // microbatches
        elif action.op in (Op.STEP, Op.ALL_REDUCE) and action.version is not None:
            k = action.version - 1
        else:
            continue
        if 0 <= k < steps:
            ends[k] = max(ends[k], end)
    return ends


def summarize(results: Sequence[RankResult], *, schedule: str, steps: int, batch_size: int,
              microbatches: int, pipelines: int = 1, first_step: int = 0,
              advance: int | None = None, memory_limit: float | None = None,
              precision: str = "full") -> TrainSummary:
    """``first_step``: steps a resumed run restored from its checkpoint (not timed here);
    ``advance``: AvgPipe's fixed advance (the online controller's choices come with the
    results); ``memory_limit`` and ``precision``: recorded as given."""
    records = [r for result in results for r in result.records]
    ends = iteration_end_times(records, microbatches, steps)
    first_start = min((s for _, _, s, _ in records), default=0.0)
    ran = steps - first_step
    if ran >= 3:
        window = (ends[first_step], ends[-1])
        samples = (ran - 1) * batch_size * pipelines
    else:
        window = (first_start, ends[-1] if ends else 0.0)
        samples = ran * batch_size * pipelines
    span = window[1] - window[0]
    ranks = max(len(results), 1 + max((r.rank for r in results), default=-1))  # partial runs
    measured = efficiency(records, ranks, window=window) if records else None
    losses = iteration_losses(results, microbatches)
    return TrainSummary(
        schedule=schedule, world_size=len(results), steps=steps, batch_size=batch_size,
        microbatches=microbatches,
        samples_per_second=samples / span if span > 0 else 0.0,
        final_loss=losses[-1] if losses else float("nan"), losses=losses,
        bubble_fraction=measured.bubble_fraction if measured else float("nan"),
        pipeline_efficiency=measured.efficiency if measured else float("nan"),
        peak_memory_bytes=[r.peak_memory_bytes for r in results],
        peak_stashed_microbatches=[r.peak_stashed_microbatches for r in results],
        wall_seconds=max((r.wall_seconds for r in results), default=0.0),
        iteration_end_s=ends, first_step=first_step,
        bytes_sent=[r.bytes_sent for r in results],
        advance_per_step=_advance_per_step(results, advance, steps),
        advance_log=next((r.advance_log for r in results if r.advance_log), []),
        memory_limit=memory_limit,
        peak_activation_bytes=[r.peak_activation_bytes for r in results],
        state_bytes=[r.state_bytes for r in results], precision=precision,
    )


def _advance_per_step(results: Sequence[RankResult], advance: int | None,
                      steps: int) -> list[int]:
    chosen = next((r.advance_per_step for r in results if r.advance_per_step), None)
    if chosen is not None:
        return list(chosen)
    return [advance] * steps if advance is not None else []
