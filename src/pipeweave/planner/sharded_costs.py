"""What sharding a stage over its data-parallel ranks costs in time (``Plan.shard``).

A stage held sharded over its ``D`` ranks with FSDP2 (docs/sharding.md) gathers its
parameters block by block before it computes and reduce-scatters its gradients once per
update instead of all-reducing them. With the ring algorithms and ``B`` the bandwidth among
the stage's ranks (the one its all-reduce uses, pipedream.txt §3.1's ``4 (D-1)|w| / (D B)``
for the two phases of a ring all-reduce)::

    all-gather of |w|      2 (D-1) |w| / (D B)     + (D-1) message latencies
    reduce-scatter of |w|  2 (D-1) |w| / (D B)     + (D-1) message latencies

per block for the gathers (each block is gathered on its own), once per stage for the
reduce-scatter. A forward gathers its stage's blocks (``full`` and ``grad-op``); a backward
gathers them again with ``full`` (ZeRO-3 reshards after the forward) and not with
``grad-op`` (kept from the forward). A split backward's ``I`` and ``W`` each gather them
again with ``full`` (the ``I`` through FSDP2's hook, the ``W`` by the stage: each reshards
after) and neither does with ``grad-op`` (the ``I`` keeps them for the ``W``; as for ``B``,
a gather that follows another backward's reshard, in the cool-down, is not counted). The
reduce-scatter takes the all-reduce's place before
the update (the schedule's ``AR``). Gathers are not overlapped with compute: on a CPU with
gloo they run in the computing thread, and pipeweave does not yet prefetch them on CUDA.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..profiler import Profile
from .partition import Bounds

__all__ = ["ShardedTimes", "ring_phase_time", "sharded_times"]


def ring_phase_time(nbytes: float, ways: int, bandwidth: float, latency: float = 0.0) -> float:
    """One phase of a ring collective (an all-gather or a reduce-scatter) of ``nbytes`` over
    ``ways`` ranks: ``2 (D-1) |w| / (D B) + (D-1) latency`` (module docstring)."""
    if ways <= 1:
        return 0.0
    transfer = 0.0 if math.isinf(bandwidth) else 2.0 * (ways - 1) * nbytes / (ways * bandwidth)
    return transfer + (ways - 1) * latency


@dataclass(frozen=True)
class ShardedTimes:
    """Per stage: seconds each forward and each backward (``B``, or ``I`` and ``W`` each)
    spend gathering, and the reduce-scatter before each update (module docstring)."""

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    """Of a ``B``, and of each of a split backward's ``I`` and ``W``."""
    reduce: tuple[float, ...]


def sharded_times(profile: Profile, bounds: Bounds, mode: str, ways: Sequence[int],
                  bandwidth: Sequence[float], latency: float) -> ShardedTimes:
    """:class:`ShardedTimes` of ``bounds`` held ``mode`` (``full`` or ``grad-op``) over
    ``ways[s]`` ranks joined at ``bandwidth[s]``, each message paying ``latency``."""
    if mode not in ("full", "grad-op"):
        raise ValueError(f"shard mode {mode!r}: give full or grad-op (none is not sharded)")
    gathers = []
    reduces = []
    for s, (start, end) in enumerate(bounds):
        blocks = profile.blocks[start:end]
        gathers.append(sum(ring_phase_time(b.parameter_bytes, ways[s], bandwidth[s], latency)
                           for b in blocks if b.parameter_bytes > 0))
        reduces.append(ring_phase_time(profile.stage_parameter_bytes(start, end), ways[s],
                                       bandwidth[s], latency))
    again = mode == "full"
    return ShardedTimes(forward=tuple(gathers),
                        backward=tuple(g if again else 0.0 for g in gathers),
                        reduce=tuple(reduces))
