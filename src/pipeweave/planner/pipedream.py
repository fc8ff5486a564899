"""PipeDream's partitioner: the dynamic program of pipedream.txt §3.1 with stage replication.

Notation of the paper, with half-open block ranges ``[i, j)``. ``T_l`` is a block's forward +
backward time, ``|w_l|`` its parameter bytes, ``a_s`` the output bytes of block ``s-1`` (what
crosses a boundary at position ``s``). On level ``k`` (``m_k`` components of level ``k-1``,
links of bandwidth ``B_k``; ``m_0 = 1``)::

    A^0(i -> j)        = sum_{l in [i, j)} T_l
    AR^k(i -> j, m)    = 4 (m - 1) sum|w_l| / (m B_k) / m_{k-1}
    T^k(i -> j, m)     = max( A^{k-1}(i -> j, m_{k-1}),  AR^k(i -> j, m) ) / m
    A^k(i -> j, m)     = min( T^k(i -> j, m),
                              min_{i < s < j, 1 <= m' < m}
                                  max( A^k(i -> s, m - m'),  2 a_s / B_k,  T^k(s -> j, m') ) )

``T^k`` is one stage replicated on ``m`` components: ``m`` inputs are processed in the time of
one, while the weights are all-reduced concurrently (wait-free back-propagation, so the max).
The all-reduce moves ``4 (m-1)/m |w|`` bytes over a worker's link: a ring reduce-scatter plus
all-gather each send and receive ``(m-1)/m |w|``; the paper prints the volume as
``2 (m-1) |w|``, PipeDream's released optimizer uses this ``4 (m-1) |w| / m`` and divides by the
``m_{k-1}`` workers inside a component, which share the work. ``allreduce_overlap=False``
adds compute and all-reduce instead of overlapping them, as that optimizer does.
``A^k`` is the slowest stage of the best pipeline on ``m`` components: either one replicated
stage, or a best sub-pipeline followed by one last stage on ``m'`` components, with the
activation and its gradient (``2 a_s``) crossing between them. The answer is
``A^L(0 -> N, m_L)``: the predicted time per minibatch of the steady state.

The last stage of each sub-problem is tried first as "the whole range is one stage", then by
increasing split ``s`` and replica count ``m'``; a later candidate must be strictly better
(ties keep the earlier one).

Options:

* ``straight``: no replication (``m' = 1`` and a single stage only on one component).
* ``memory_limit`` (single-level topologies): a replica of a stage that is followed by ``W``
  more workers keeps ``n = ceil((m' + W) / m')`` micro-batches in flight (NOAM for the input
  stage), each with its stashed activations and weight version, plus the optimizer state:
  ``n (activation + parameter bytes) + optimizer bytes <= memory_limit``.

The levels are solved lowest first in principle (every level but the top one for all ranges
``[i, j)``, the top one for ``[0, N)``); :mod:`pipeweave.planner.pipedream_dp` solves them
exactly with branch and bound, only the ranges the top level can use, so 1,000 blocks on
1,024 workers (8 x 128) take seconds. The flattened plan multiplies replication factors down
the levels (a top-level stage on ``m'`` servers, whose server-level pipeline replicates an
inner stage ``r`` times, becomes a stage with ``r m'`` replicas).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .partition import Bounds
from .pipedream_dp import LevelSolver, Memory, prefix_sums
from .topology import Topology

__all__ = ["PipeDreamSolution", "TopStage", "pipedream_partition", "allreduce_time", "noam"]


@dataclass(frozen=True)
class PipeDreamSolution:
    """The optimizer's output.

    Attributes:
        bounds: block range of every (flattened) stage.
        replicas: replication factor of every stage.
        time_per_minibatch: ``A^L(0 -> N, m_L)`` in seconds: the slowest stage's time per
            minibatch including communication (the predicted steady-state time per minibatch).
        stage_times: per stage, its effective time per minibatch: ``max(compute, all-reduce)``
            over its replicas (the all-reduce at the bandwidth of the highest level they span),
            divided by its replica count.
        top_level: the top level's stages.
        boundary_levels: for each boundary between consecutive stages, the 1-based level of the
            link it crosses.
        replica_levels: for each stage, the highest 1-based level its replicas span (0: one
            replica).
        noam: NUM_OPT_ACTIVE_MINIBATCHES = ceil(workers / replicas of the input stage).
    """

    bounds: Bounds
    replicas: tuple[int, ...]
    time_per_minibatch: float
    stage_times: tuple[float, ...]
    top_level: tuple[TopStage, ...]
    boundary_levels: tuple[int, ...]
    replica_levels: tuple[int, ...]
    noam: int


def allreduce_time(parameter_bytes: float, replicas: int, bandwidth: float) -> float:
    """``4 (m-1) |w| / (m B)``: a ring all-reduce of ``|w|`` bytes among ``m`` replicas."""
    if replicas <= 1 or math.isinf(bandwidth):
        return 0.0
    return 4.0 * (replicas - 1) * parameter_bytes / (replicas * bandwidth)


def noam(workers: int, input_replicas: int) -> int:
    """pipedream.txt §3.2: ``ceil(workers / replicas of the input stage)``."""
    return -(-workers // input_replicas)


class TopStage(NamedTuple):
    """A stage of the top level: blocks ``[start, end)`` on ``components`` of its machines."""

    start: int
    end: int
    components: int


class _FlatStage(NamedTuple):
    """A stage of the flattened plan."""

    start: int
    end: int
    replicas: int
    level: int
    """The highest 1-based level its replicas span (0: one replica)."""


def _stages(level: LevelSolver, start: int, end: int, machines: int) -> list[TopStage]:
    """Level ``level``'s stages of ``[start, end)`` on ``machines`` components, first first."""
    out = []
    while True:
        split, replicas = level.choice(start, end, machines)
        if split < 0:
            out.append(TopStage(start, end, machines))
            break
        out.append(TopStage(split, end, replicas))
        end, machines = split, machines - replicas
    out.reverse()
    return out


def pipedream_partition(
    compute: Sequence[float],
    parameter_bytes: Sequence[float],
    output_bytes: Sequence[float],
    topology: Topology,
    *,
    straight: bool = False,
    allreduce_overlap: bool = True,
    memory_limit: float | None = None,
    activation_bytes: Sequence[float] | None = None,
    optimizer_bytes: Sequence[float] | None = None,
) -> PipeDreamSolution:
    """Solve the dynamic program of the module docstring for a chain of blocks."""
    n = len(compute)
    _check_chain(compute, parameter_bytes, output_bytes, topology, straight)
    memory = _memory(topology, memory_limit,
                     output_bytes if activation_bytes is None else activation_bytes,
                     parameter_bytes, optimizer_bytes)
    levels = _solve_levels(compute, parameter_bytes, output_bytes, topology, straight,
                           allreduce_overlap, memory)
    top_level = levels[-1]
    best = float(top_level.time[0, n, topology.levels[-1].machines])
    if not math.isfinite(best):
        raise ValueError(_infeasible_message(n, topology, straight, memory_limit))
    flat: list[_FlatStage] = []
    boundaries: list[int] = []
    _flatten(levels, topology, len(levels) - 1, 0, n, topology.levels[-1].machines, 1, 0,
             flat, boundaries)
    replicas = tuple(stage.replicas for stage in flat)
    stage_times = tuple(
        _stage_time(compute, parameter_bytes, a, b, r, topology, level, allreduce_overlap)
        for a, b, r, level in flat
    )
    return PipeDreamSolution(
        bounds=tuple((stage.start, stage.end) for stage in flat), replicas=replicas,
        time_per_minibatch=best, stage_times=stage_times,
        top_level=tuple(_stages(top_level, 0, n, topology.levels[-1].machines)),
        boundary_levels=tuple(boundaries), replica_levels=tuple(stage.level for stage in flat),
        noam=noam(topology.workers, replicas[0]),
    )


def _check_chain(compute: Sequence[float], parameter_bytes: Sequence[float],
                 output_bytes: Sequence[float], topology: Topology, straight: bool) -> None:
    n = len(compute)
    if n == 0 or len(parameter_bytes) != n or len(output_bytes) != n:
        raise ValueError(f"need one compute time, parameter size and output size per block, got "
                         f"{len(compute)}, {len(parameter_bytes)} and {len(output_bytes)}")
    if straight and topology.workers > n:
        raise ValueError(
            f"a straight pipeline on {topology.workers} workers needs at least {topology.workers} "
            f"blocks, the model has {n}; allow replication (drop --straight) or use fewer ranks"
        )


def _memory(topology: Topology, memory_limit: float | None, activation_bytes: Sequence[float],
            parameter_bytes: Sequence[float],
            optimizer_bytes: Sequence[float] | None) -> Memory | None:
    """The memory constraint of the top level (None: no limit)."""
    if memory_limit is None:
        return None
    if len(topology.levels) != 1:
        raise ValueError("memory_limit is supported for single-level topologies only; give "
                         "one level (e.g. --topology 8x1e9) or drop the memory limit")
    opt = optimizer_bytes if optimizer_bytes is not None else [0.0] * len(parameter_bytes)
    return Memory(prefix_sums(activation_bytes), prefix_sums(parameter_bytes), prefix_sums(opt),
                  float(memory_limit))


def _solve_levels(compute: Sequence[float], parameter_bytes: Sequence[float],
                  output_bytes: Sequence[float], topology: Topology, straight: bool,
                  allreduce_overlap: bool, memory: Memory | None) -> list[LevelSolver]:
    """One solver per level, lowest first, the top one solved (it solves those below)."""
    raw = prefix_sums(compute)
    weights = prefix_sums(parameter_bytes)
    # the lower bounds of pipedream_dp need non-negative times and sizes (see there)
    bounded = bool(np.all(np.asarray(compute, dtype=float) >= 0)
                   and np.all(np.asarray(parameter_bytes, dtype=float) >= 0)
                   and np.all(np.isfinite(raw)) and np.all(np.isfinite(weights)))
    levels: list[LevelSolver] = []
    for index, level in enumerate(topology.levels):
        top = index == len(topology.levels) - 1
        levels.append(LevelSolver(
            raw, levels[-1] if levels else None, weights, output_bytes, level.machines,
            level.bandwidth, bounded=bounded, all_starts=not top, straight=straight,
            overlap=allreduce_overlap, memory=memory if top else None, workers=level.machines,
        ))
    levels[-1].solve()
    return levels


def _flatten(levels: list[LevelSolver], topology: Topology, index: int, start: int, end: int,
             machines: int, multiplier: int, replicated_level: int,
             out: list[_FlatStage], boundaries: list[int]) -> None:
    """Expand level ``index``'s stages of ``[start, end)`` down to level 1 (module docstring)."""
    for position, (a, b, components) in enumerate(_stages(levels[index], start, end, machines)):
        if position:
            boundaries.append(index + 1)
        level = max(index + 1, replicated_level) if components > 1 else replicated_level
        if index == 0:
            out.append(_FlatStage(a, b, components * multiplier, level))
        else:
            _flatten(levels, topology, index - 1, a, b, topology.levels[index - 1].machines,
                     components * multiplier, level, out, boundaries)


def _stage_time(compute: Sequence[float], parameter_bytes: Sequence[float], start: int, end: int,
                replicas: int, topology: Topology, level: int, overlap: bool) -> float:
    work = float(sum(compute[start:end]))
    bandwidth = topology.levels[level - 1].bandwidth if level else math.inf
    reduce = allreduce_time(float(sum(parameter_bytes[start:end])), replicas, bandwidth)
    return (max(work, reduce) if overlap else work + reduce) / replicas


def _infeasible_message(n: int, topology: Topology, straight: bool,
                        memory_limit: float | None) -> str:
    if memory_limit is not None:
        return (f"no partition of {n} blocks on {topology.workers} workers fits the memory limit "
                f"of {memory_limit:.6g} bytes per worker (stashed activations and weight versions "
                "of the in-flight minibatches plus optimizer state); raise --memory-limit or use "
                "more workers")
    what = "straight pipeline" if straight else "pipeline"
    return f"no {what} of {n} blocks on {topology} exists; use fewer workers or more blocks"
