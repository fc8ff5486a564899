"""Which link every transfer of a candidate crosses, from the topology and the rank layout.

Ranks fill the topology's lowest level first (ranks ``0 .. m1-1`` on the first machine, ...),
and copy ``k`` of a ``d``-rank pipeline uses ranks ``k*d ..`` (:meth:`Layout.data_parallel`).
A transfer between ranks ``a`` and ``b`` crosses the lowest level whose components hold both;
a stage's all-reduce among its replicas runs at the slowest link its ring crosses, i.e. the
lowest level whose components hold every replica. So a deep pipeline keeps its point-to-point
traffic inside a machine while the all-reduce of the copies crosses machines, and a wide one
the other way round; the simulator prices both (WPipe §3.3's trade-off between C_WPipe and
C_DP, pipedream.txt §3.1's hierarchical levels).

``rank_order`` (optional) renumbers the ranks before they are placed on the machines: the
hook for a placement that puts pipeline neighbours and data-parallel peers elsewhere.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

from ..ir import Layout
from ..planner.evaluate import Network
from ..planner.topology import Topology
from ..profiler import Profile

__all__ = ["default_topology", "layout_network", "level_sizes", "replica_bandwidths"]


def default_topology(profile: Profile, ranks: int) -> Topology:
    """One level of ``ranks`` workers at the profile's measured link (free without one)."""
    link = profile.link
    return Topology.single(ranks, link.bandwidth if link is not None else math.inf)


def level_sizes(topology: Topology) -> list[int]:
    """Workers in one component of each level, lowest first, from 1 (a device) upwards."""
    sizes = [1]
    for level in topology.levels:
        sizes.append(sizes[-1] * level.machines)
    return sizes


def _bandwidth(topology: Topology, sizes: list[int], ranks: Sequence[int]) -> float:
    """The link of the lowest level whose components hold all of ``ranks``."""
    for index in range(1, len(sizes)):
        if len({r // sizes[index] for r in ranks}) == 1:
            return math.inf if index == 1 and len(set(ranks)) == 1 else \
                topology.levels[index - 1].bandwidth
    return topology.levels[-1].bandwidth


def layout_network(topology: Topology, layout: Layout, *, latency: float = 0.0,
                   shared_cores: int | None = None,
                   rank_order: Sequence[int] | None = None) -> Network:
    """The :class:`Network` of ``layout`` on ``topology`` (module docstring)."""
    sizes = level_sizes(topology)
    place = (lambda r: r) if rank_order is None else (lambda r: rank_order[r])
    first = [place(ranks[0]) for ranks in layout.stage_ranks]
    boundaries = []
    for s in range(layout.num_stages - 1):
        a, b = first[s], first[s + 1]
        boundaries.append(math.inf if a == b else _bandwidth(topology, sizes, (a, b)))
    reduce = [_bandwidth(topology, sizes, [place(r) for r in ranks]) if len(ranks) > 1
              else math.inf for ranks in layout.stage_ranks]
    return Network(bandwidth=boundaries if boundaries else math.inf, latency=latency,
                   allreduce_bandwidth=reduce, shared_cores=shared_cores)


@lru_cache(maxsize=256)
def replica_bandwidths(topology: Topology, depth: int, width: int) -> tuple[float, ...]:
    """Per stage of a ``depth``-rank pipeline in ``width`` copies (copy ``k`` on ranks
    ``k * depth ..``): the link its all-reduce runs at, known before the model is split."""
    sizes = level_sizes(topology)
    return tuple(_bandwidth(topology, sizes, [s + k * depth for k in range(width)])
                 for s in range(depth))
