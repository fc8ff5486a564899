"""PipeDream's dynamic program, remembered across micro-batch sizes that scale by powers of two.

``pipeweave auto`` asks the ``pipedream`` method for every pipeline depth at several
micro-batch sizes (1, 2, 4, 8 samples: a profile scaled proportionally,
:mod:`pipeweave.auto.scaling`), and for a straight pipeline without a memory limit the
problem then differs only by a power-of-two factor on the block times and the bytes they
send. Every operation of the dynamic program on those numbers (:mod:`.pipedream_dp`: sums,
prefix sums, maxima, minima, divisions by a bandwidth or a replica count, comparisons,
relative slack) commutes exactly with multiplying them by ``2^k`` (binary floating point,
no overflow or subnormal on the way; the all-reduce, which reads parameter bytes that do
not scale, is 0 where no stage is replicated), so the answer for ``2^k x`` is the answer for
``x`` with its times multiplied by ``2^k``, to the last bit, the same bounds, replicas and
ties. Here each problem is solved at the scale whose largest block time lies in
``[0.5, 1)`` and remembered; ``tests/planner/test_pipedream_cache.py`` compares the answers
with :func:`.pipedream.pipedream_partition` asked directly, with ``==``.

With replication (``straight=False``) or a memory limit (bytes held against a fixed limit)
the problem is not homogeneous, and is solved and remembered as given.
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace

import numpy as np

from .pipedream import PipeDreamSolution, pipedream_partition
from .topology import Topology

__all__ = ["pipedream_solution", "solution_cache"]

_SAFE = 2.0 ** 700
"""Magnitudes kept between ``1 / _SAFE`` and ``_SAFE`` (both scales) so that no sum,
product or division by a bandwidth of the program overflows or turns subnormal."""


def pipedream_solution(
    compute: tuple[float, ...], parameter_bytes: tuple[float, ...],
    output_bytes: tuple[float, ...], activation_bytes: tuple[float, ...],
    optimizer_bytes: tuple[float, ...], topology: Topology, *, straight: bool, overlap: bool,
    memory_limit: float | None,
) -> PipeDreamSolution:
    """:func:`.pipedream.pipedream_partition` of these blocks, remembered (module docstring)."""
    factor = _power_of_two(compute, output_bytes, activation_bytes) \
        if straight and memory_limit is None else 1.0
    if factor == 1.0:
        return _solved(compute, parameter_bytes, output_bytes, activation_bytes,
                       optimizer_bytes, topology, straight, overlap, memory_limit)
    solution = _solved(_divided(compute, factor), parameter_bytes,
                       _divided(output_bytes, factor), _divided(activation_bytes, factor),
                       optimizer_bytes, topology, straight, overlap, memory_limit)
    return replace(solution, time_per_minibatch=solution.time_per_minibatch * factor,
                   stage_times=tuple(t * factor for t in solution.stage_times))


def _power_of_two(*columns: tuple[float, ...]) -> float:
    """``2^k`` with the largest block time over ``2^k`` in ``[0.5, 1)``; 1 where a value is
    not finite or the scaled values would leave the safe range."""
    values = np.abs(np.concatenate([np.asarray(c, dtype=float) for c in columns]))
    if values.size == 0 or not np.all(np.isfinite(values)) or not np.any(columns[0]):
        return 1.0
    factor = math.ldexp(1.0, math.frexp(float(np.max(np.abs(columns[0]))))[1])
    nonzero = values[values > 0]
    for scale in (1.0, factor):
        if nonzero.size and (nonzero.min() / scale < 1 / _SAFE or nonzero.max() / scale > _SAFE):
            return 1.0
    return factor


def _divided(values: tuple[float, ...], factor: float) -> tuple[float, ...]:
    return tuple(v / factor for v in values)


@functools.lru_cache(maxsize=64)
def _solved(
    compute: tuple[float, ...], parameter_bytes: tuple[float, ...], output_bytes: tuple[float, ...],
    activation_bytes: tuple[float, ...], optimizer_bytes: tuple[float, ...], topology: Topology,
    straight: bool, overlap: bool, memory_limit: float | None,
) -> PipeDreamSolution:
    """The DP's answer, remembered: it does not depend on the micro-batch count, which
    ``pipeweave auto`` varies for every pipeline depth (a pure function of its arguments)."""
    return pipedream_partition(
        compute, parameter_bytes, output_bytes, topology, straight=straight,
        allreduce_overlap=overlap, memory_limit=memory_limit,
        activation_bytes=activation_bytes, optimizer_bytes=optimizer_bytes,
    )


solution_cache = _solved
"""The remembered solutions (``functools.lru_cache``: ``cache_info()``, ``cache_clear()``)."""
