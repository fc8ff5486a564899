"""AvgPipe's profiling-based tuner (avgpipe.txt §5.2): predict every (M, N) from one profile,
pick the fastest under a memory limit; and the traversal it is compared with (§7.3).

:func:`predict` applies Equations 1-8 (:mod:`pipeweave.avgpipe.equations`) to a
:class:`~pipeweave.avgpipe.profile.TuningProfile`. The objective is the time per *batch*,
``iteration time / N`` (each of the ``N`` pipelines trains one batch per iteration); the
iteration time is the slowest rank's Equation 1. Two readings of "N pipelines share a GPU":

``mode="concurrent"`` — the paper's: each pipeline is a separate process and the GPU runs
    them at once, so ``n*/n`` pipelines raise the utilisation (Equation 2's ``n*/n``) and the
    equations are applied literally to per-batch quantities (profile / n).

``mode="interleaved"`` (default) — pipeweave's runtime: one program per rank interleaves the
    pipelines' actions (``schedules/avgpipe.py``), so nothing runs at once and ``N`` pipelines
    of ``M`` micro-batches time like one pipeline of ``N·M`` micro-batches of the same size::

        N=2, M=2   rank0  F0 F0' F1 F1' . . B0 B0' B1 B1'      (' = pipeline 1)
                   rank1  .  F0  F0' F1 F1' B0 B0' B1 B1'

    The equations are applied to per-iteration quantities: Equation 2 with ``n* = n`` (no
    concurrency) gives one batch's computation, times ``n*`` batches; Equations 3-7 count
    the ``n*·m*`` micro-batches a rank runs per iteration; Equation 4's ``(𝕋)* = n*/n 𝕋`` is
    kept (``n*`` batches cross the links).

The profile keeps the per-iteration work (each pipeline's optimizer step and elastic
averaging, ``RankProfile.update_s``) out of ``T_gpu``: Equation 2 scales ``T_gpu`` with the
number of micro-batches, which that work does not depend on; it is added, ``n*/n`` of it, to
the computation of Equation 1 (and left out of the bubbles of Equations 6-7, which are about
micro-batches).

Memory (Equation 8) is per rank; ``memory="paper"`` applies it literally, ``memory="held"``
(default) also corrects the data term for the number of micro-batches a rank holds: Equation
8 assumes it does not change with ``M``, but 1F1B with ``a`` forwards in advance holds
``min(K - k + a, M)`` on rank ``k`` (of ``K``), which does for small ``M``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .equations import (eq1_time, eq2_compute, eq4_comm, eq5_bubble, eq6_upstream,
                        eq7_downstream, eq8_memory)
from .profile import RankProfile, TuningProfile

__all__ = ["TuningProfile", "RankPrediction", "Prediction", "TuneResult", "Measurement",
           "TraversalResult", "predict", "tune", "traverse", "settings", "held_microbatches",
           "MODES", "MEMORY_RULES"]

Mode = Literal["interleaved", "concurrent"]
MemoryRule = Literal["held", "paper"]
MODES = ("interleaved", "concurrent")
MEMORY_RULES = ("held", "paper")


@dataclass(frozen=True)
class RankPrediction:
    """Equation 1's parts for one rank, per iteration, and Equation 8's memory."""

    compute_s: float
    comm_s: float
    bubble_s: float
    memory_bytes: float

    @property
    def total_s(self) -> float:
        return eq1_time(self.compute_s, self.comm_s, self.bubble_s)


@dataclass(frozen=True)
class Prediction:
    """The predicted time and memory of one setting."""

    microbatches: int
    pipelines: int
    ranks: tuple[RankPrediction, ...]

    @property
    def iteration_s(self) -> float:
        """The slowest rank's Equation 1 (all ``N`` batches of an iteration)."""
        return max(r.total_s for r in self.ranks)

    @property
    def batch_s(self) -> float:
        """Time per batch, the quantity the tuner minimises."""
        return self.iteration_s / self.pipelines

    @property
    def memory_bytes(self) -> float:
        """The largest rank's memory (the limit applies to every device)."""
        return max(r.memory_bytes for r in self.ranks)


@dataclass(frozen=True)
class Measurement:
    """One setting as measured (or simulated) by a traversal."""

    microbatches: int
    pipelines: int
    iteration_s: float
    memory_bytes: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def batch_s(self) -> float:
        return self.iteration_s / self.pipelines


@dataclass(frozen=True)
class TuneResult:
    """:func:`tune`'s answer: every prediction, the pick and how long predicting took."""

    predictions: tuple[Prediction, ...]
    best: Prediction | None
    memory_limit: float | None
    elapsed_s: float

    def feasible(self, prediction: Prediction) -> bool:
        return self.memory_limit is None or prediction.memory_bytes <= self.memory_limit


@dataclass(frozen=True)
class TraversalResult:
    """:func:`traverse`'s answer: every measurement, the best and how long measuring took."""

    measurements: tuple[Measurement, ...]
    best: Measurement | None
    memory_limit: float | None
    elapsed_s: float

    def feasible(self, measurement: Measurement) -> bool:
        return self.memory_limit is None or measurement.memory_bytes <= self.memory_limit

    def find(self, microbatches: int, pipelines: int) -> Measurement:
        for m in self.measurements:
            if (m.microbatches, m.pipelines) == (microbatches, pipelines):
                return m
        raise KeyError((microbatches, pipelines))


def held_microbatches(rank: int, stages: int, microbatches: int, advance: int = 0) -> int:
    """Micro-batches rank ``rank`` holds at once under 1F1B with ``advance`` forwards in advance."""
    return min(stages - rank + advance, microbatches)


def predict(profile: TuningProfile, microbatches: int, pipelines: int, *,
            mode: Mode = "interleaved", memory: MemoryRule = "held") -> Prediction:
    """Time and memory of ``(microbatches, pipelines)`` predicted from ``profile`` (module doc)."""
    _check_count("microbatches", microbatches)
    _check_count("pipelines", pipelines)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if memory not in MEMORY_RULES:
        raise ValueError(f"memory must be one of {MEMORY_RULES}, got {memory!r}")
    m, n, m_star, n_star = profile.microbatches, profile.pipelines, microbatches, pipelines
    ranks = profile.ranks
    if mode == "concurrent":
        # literal, per batch (the profile's iteration holds n batches); x n* per iteration
        compute = [eq2_compute(r.compute_s / n, _per(r, n), m, n, m_star, n_star) for r in ranks]
        total = [r.comm_total_s / n for r in ranks]
        count, to_iteration = m_star, n_star
    else:
        # per iteration: Eq. 2 without concurrency (n* = n) for one batch, times n* batches;
        # the n* m* micro-batches of an iteration stream like one pipeline's
        compute = [n_star * eq2_compute(r.compute_s / n, _per(r, n), m, n, m_star, n)
                   for r in ranks]
        total = [r.comm_total_s for r in ranks]
        count, to_iteration = n_star * m_star, 1
    blocking = [eq4_comm(t, c, n, n_star, count) for t, c in zip(total, compute)]   # Eq. 4
    comm_star = [n_star / n * t for t in total]                    # (𝕋^k)* = n*/n 𝕋^k, Eq. 4
    up = eq6_upstream(comm_star, compute, count)                                     # Eq. 6
    down = eq7_downstream(comm_star, compute, count)                                 # Eq. 7
    out = []
    for k, rank in enumerate(ranks):
        data = rank.data_bytes
        if memory == "held":
            data *= (held_microbatches(k, len(ranks), m_star, profile.advance)
                     / held_microbatches(k, len(ranks), m, profile.advance))
        out.append(RankPrediction(
            # + the per-iteration work (steps, averaging) of n* pipelines, which M leaves alone
            compute_s=to_iteration * compute[k] + n_star / n * rank.update_s,
            comm_s=to_iteration * blocking[k],
            bubble_s=to_iteration * eq5_bubble(up[k], down[k]),                      # Eq. 5
            memory_bytes=rank.fixed_bytes + eq8_memory(rank.model_bytes, data, m, n,
                                                       m_star, n_star),              # Eq. 8
        ))
    return Prediction(microbatches=m_star, pipelines=n_star, ranks=tuple(out))


def settings(microbatches: Sequence[int], pipelines: Sequence[int],
             batch_size: int | None = None) -> list[tuple[int, int]]:
    """The grid ``microbatches x pipelines``; with ``batch_size``, only M that divide it."""
    if not microbatches or not pipelines:
        raise ValueError("the (M, N) grid is empty; give at least one micro-batch count and one "
                         "pipeline count, e.g. --microbatches-grid 2,4,8 --pipelines-grid 1,2")
    for value in itertools.chain(microbatches, pipelines):
        _check_count("grid value", value)
    if batch_size is not None:
        bad = [m for m in microbatches if batch_size % m]
        if bad:
            raise ValueError(f"micro-batch counts {bad} do not divide the batch size {batch_size}; "
                             f"use divisors of {batch_size}")
    return [(m, n) for m in sorted(set(microbatches)) for n in sorted(set(pipelines))]


def tune(profile: TuningProfile, microbatches: Sequence[int], pipelines: Sequence[int], *,
         memory_limit: float | None = None, mode: Mode = "interleaved",
         memory: MemoryRule = "held") -> TuneResult:
    """Predict every setting of the grid and choose the fastest whose memory fits (§5.2.3,
    last paragraph). Ties go to the smaller memory."""
    started = time.perf_counter()
    grid = settings(microbatches, pipelines, profile.batch_size)
    _check_limit(memory_limit, profile)
    predictions = tuple(predict(profile, m, n, mode=mode, memory=memory) for m, n in grid)
    feasible = [p for p in predictions if memory_limit is None or p.memory_bytes <= memory_limit]
    best = min(feasible, key=lambda p: (p.batch_s, p.memory_bytes), default=None)
    return TuneResult(predictions, best, memory_limit, time.perf_counter() - started)


def traverse(measure: Callable[[int, int], Measurement], microbatches: Sequence[int],
             pipelines: Sequence[int], *, memory_limit: float | None = None,
             batch_size: int | None = None) -> TraversalResult:
    """Measure every setting with ``measure(M, N)`` and choose the fastest that fits (§5.1's
    traversal, the baseline of §7.3)."""
    started = time.perf_counter()
    measurements = tuple(measure(m, n) for m, n in settings(microbatches, pipelines, batch_size))
    feasible = [x for x in measurements if memory_limit is None or x.memory_bytes <= memory_limit]
    best = min(feasible, key=lambda x: (x.batch_s, x.memory_bytes), default=None)
    return TraversalResult(measurements, best, memory_limit, time.perf_counter() - started)


def _per(rank: RankProfile, n: int) -> list[tuple[float, float]]:
    """The utilisation histogram of one batch (the profile's iteration holds ``n``)."""
    return [(level, seconds / n) for level, seconds in rank.utilisation]


def _check_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def _check_limit(limit: float | None, profile: TuningProfile) -> None:
    if limit is None:
        return
    if not limit > 0:
        raise ValueError(f"memory limit must be > 0 bytes, got {limit!r}")
    # the smallest any setting can take on a rank: one parallel model plus what is fixed
    need = max(r.fixed_bytes + r.model_bytes / profile.pipelines for r in profile.ranks)
    if limit < need:
        raise ValueError(
            f"memory limit {limit:.0f} bytes is below the model size: one pipeline's stage "
            f"needs {need:.0f} bytes (weights, gradients, optimizer state and the reference "
            f"model) before any activation; raise --memory-limit above {need:.0f} or use more stages"
        )
