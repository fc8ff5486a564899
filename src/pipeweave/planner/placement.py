"""WPipe's topology-aware placement of a depth x width hybrid (wpipe.txt §3.4, A.3, Table 3).

A hybrid of pipeline depth ``d`` and data-parallel width ``w`` (``d w`` ranks) has two kinds of
traffic: point-to-point activations and gradients between consecutive stages of a pipeline
copy, and the all-reduce of each stage's gradients among its ``w`` replicas. On a hierarchical
topology (:class:`.Topology`: e.g. ``4x1.2e10,4x1.25e9``, 4 GPUs per machine on NVLink-class
links, 4 machines on Ethernet) which of them rides the fast links depends on where each
``(stage, replica)`` goes. WPipe's rule (A.3, "Heterogeneous Network Communication"): the
traffic with the larger cost gets the intra-machine bandwidth. Table 3 measures both ways for
ResNeXt-500, ``4:16``: A (pipeline inside machines, all-reduce across) 607.8 samples/s, B (the
reverse) 497.3, since for a CNN the pipeline traffic is the bottleneck.

The placements enumerated here split every level's ``m_k`` components between the two axes:
``a_k`` pipeline positions times ``b_k`` replicas (``a_k b_k = m_k``, ``prod a_k = d``,
``prod b_k = w``). A rank's digit on level ``k`` (lowest first) is ``p_k + a_k q_k``, its
pipeline digit ``p_k`` and replica digit ``q_k`` (their order inside a level changes no link);
stage and replica are the mixed-radix numbers ``p_1 + a_1 (p_2 + a_2 (...))`` and likewise
for ``q``, so consecutive stages sit as low in the hierarchy as the split allows. Two of them have names:

* ``pipeline-inner`` (WPipe's A): ``rank = replica * d + stage``, the pipeline on the lowest
  levels; this is the rank map pipeweave's runtime runs (:meth:`.Layout.data_parallel`: copy
  ``k`` on ranks ``k d .. k d + d - 1``, and launchers number ranks machine by machine);
* ``data-inner`` (WPipe's B): ``rank = stage * w + replica``, the replicas on the lowest levels.

Every other placement (``mixed``) is a prediction only: the runtime does not take a rank map.

Cost model, per iteration (the simulator's own: :func:`.plan_costs` charges a boundary's
transfer at ``bytes / bandwidth`` and a stage's all-reduce as :func:`.allreduce_time`, and
:meth:`Placement.network` hands these bandwidths to it)::

    bandwidth of a boundary   the slowest level any copy's transfer over it crosses
    bandwidth of a stage      the slowest level its replicas span (inf for w = 1)
    p2p_time        = sum_s p2p_bytes[s] / bandwidth(boundary s)
    allreduce_time  = max_s 4 (w-1)/w allreduce_bytes[s] / bandwidth(stage s)
    communication_time = p2p_time + allreduce_time

``p2p_time`` sums the boundaries as §3.4's ``C_WPipe = 2(2N_s - 1) C_a`` does; the stages
all-reduce at once on disjoint groups, hence the max. A level's bandwidth is per worker, as in
PipeDream's topology (pipedream.txt §3.1): links shared by several transfers at once are not
divided. WPipe's rule compares the two traffics at equal bandwidth, ``sum_s p2p_bytes[s]``
against ``max_s 4 (w-1)/w allreduce_bytes[s]``, and picks ``pipeline-inner`` when the first is
at least the second, ``data-inner`` otherwise. On ``m`` machines of ``m`` GPUs with ``d = w
= m`` (each named map puts one traffic wholly on each level) that is exactly the cheaper of the
two; elsewhere (e.g. ``d`` spanning machines) the enumeration can disagree with the rule, and
the ranking, not the rule, is the prediction.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..profiler import Profile
from .evaluate import Network
from .partition import Bounds
from .pipedream import allreduce_time
from .topology import Topology

__all__ = ["Placement", "placements", "profile_traffic", "runtime_table", "wpipe_rule_choice"]

Table = tuple[tuple[int, ...], ...]
"""``table[stage][replica]``: the rank of that stage's replica."""


@dataclass(frozen=True)
class Placement:
    """One rank map of a ``depth x width`` hybrid and its predicted communication.

    Attributes:
        name: ``pipeline-inner`` (WPipe's A, the runtime's), ``data-inner`` (B) or ``mixed``.
        table: ``table[stage][replica]`` is the rank (ranks fill the topology's lowest level
            first: rank ``r`` is on machine ``r // m_1``).
        pipeline_split: per level, lowest first, how many digits a pipeline copy's ranks use
            there (``a_k``).
        data_split: per level, how many digits a stage's replicas use there (``b_k``).
        p2p_bandwidth: bytes/s of each of the ``depth - 1`` boundaries (the slowest copy's).
        allreduce_bandwidth: bytes/s of each stage's all-reduce (``inf``: one replica).
        p2p_time: seconds of point-to-point traffic per iteration (module docstring).
        allreduce_time: seconds of the slowest stage's all-reduce per iteration.
        runtime: this is the rank map pipeweave's runtime uses; the others are predictions.
        wpipe_rule: WPipe's rule chooses this placement.
    """

    name: str
    table: Table
    pipeline_split: tuple[int, ...]
    data_split: tuple[int, ...]
    p2p_bandwidth: tuple[float, ...]
    allreduce_bandwidth: tuple[float, ...]
    p2p_time: float
    allreduce_time: float
    runtime: bool = False
    wpipe_rule: bool = False

    @property
    def depth(self) -> int:
        return len(self.table)

    @property
    def width(self) -> int:
        return len(self.table[0])

    @property
    def communication_time(self) -> float:
        return self.p2p_time + self.allreduce_time

    def rank_of(self, stage: int, replica: int) -> int:
        return self.table[stage][replica]

    def network(self, latency: float = 0.0, shared_cores: int | None = None) -> Network:
        """The links for :func:`.plan_costs` / :class:`.Evaluator` with ``replicas=(w,) * d``."""
        return Network(bandwidth=list(self.p2p_bandwidth) if self.p2p_bandwidth else math.inf,
                       latency=latency, allreduce_bandwidth=list(self.allreduce_bandwidth),
                       shared_cores=shared_cores)

    def to_json(self) -> dict[str, Any]:
        def finite(values: Sequence[float]) -> list[float | None]:
            return [None if math.isinf(v) else v for v in values]
        return {"name": self.name, "table": [list(row) for row in self.table],
                "pipeline_split": list(self.pipeline_split), "data_split": list(self.data_split),
                "p2p_bandwidth": finite(self.p2p_bandwidth),
                "allreduce_bandwidth": finite(self.allreduce_bandwidth),
                "p2p_time": self.p2p_time, "allreduce_time": self.allreduce_time,
                "communication_time": self.communication_time,
                "runtime": self.runtime, "wpipe_rule": self.wpipe_rule}


def placements(topology: Topology, depth: int, width: int, *,
               p2p_bytes: float | Sequence[float],
               allreduce_bytes: float | Sequence[float]) -> list[Placement]:
    """Every placement of ``depth x width`` on ``topology``, fastest communication first.

    Args:
        topology: hierarchical levels, lowest first; ``topology.workers`` must be ``depth *
            width``.
        depth, width: pipeline depth ``d`` and data-parallel width ``w``.
        p2p_bytes: bytes over each boundary of one pipeline copy per iteration (activations
            forward plus gradients backward, all of the copy's micro-batches): one number or
            ``d - 1`` values.
        allreduce_bytes: bytes each stage all-reduces per iteration (its gradients, the size of
            its parameters): one number or ``d`` values.

    Ties keep ``pipeline-inner`` (the runtime's) first, then ``data-inner``, then the order of
    enumeration. Exactly one placement has ``wpipe_rule`` set and one has ``runtime`` set.
    """
    p2p, reduce = _check(topology, depth, width, p2p_bytes, allreduce_bytes)
    runtime = runtime_table(depth, width)
    data_inner = tuple(tuple(stage * width + q for q in range(width)) for stage in range(depth))
    chosen = runtime if wpipe_rule_choice(width, p2p, reduce) == "pipeline-inner" else data_inner
    found: dict[Table, Placement] = {}
    # every split along the levels, then the two named maps (d may not split along them)
    for table in [*(_table(topology, split) for split in _splits(topology, depth)),
                  runtime, data_inner]:
        if table not in found:
            found[table] = _priced(topology, table, p2p, reduce,
                                   runtime=runtime, chosen=chosen, data_inner=data_inner)
    first = {"pipeline-inner": 0, "data-inner": 1, "mixed": 2}
    return sorted(found.values(), key=lambda p: (p.communication_time, first[p.name]))


def profile_traffic(profile: Profile, bounds: Bounds, microbatches_per_copy: int
                    ) -> tuple[list[float], list[float]]:
    """``(p2p_bytes, allreduce_bytes)`` of a partition for :func:`placements`: over boundary
    ``s``, the last block's output forward and its gradient backward for each of a copy's
    micro-batches (``2 M output_bytes``: what :func:`.plan_costs` charges as transfers); per
    stage, its parameter bytes (the gradients all-reduced)."""
    blocks = profile.blocks
    p2p = [2.0 * microbatches_per_copy * blocks[e - 1].output_bytes for _, e in bounds[:-1]]
    reduce = [sum(b.parameter_bytes for b in blocks[a:e]) for a, e in bounds]
    return p2p, reduce


def runtime_table(depth: int, width: int) -> Table:
    """The runtime's rank map (:meth:`.Layout.data_parallel`): ``rank = replica * d + stage``."""
    return tuple(tuple(q * depth + stage for q in range(width)) for stage in range(depth))


def wpipe_rule_choice(width: int, p2p_bytes: Sequence[float], allreduce_bytes: Sequence[float]
                      ) -> str:
    """WPipe's rule (A.3): the larger traffic, at equal bandwidth, gets the lowest levels."""
    pipeline = sum(p2p_bytes)
    data = max(4.0 * (width - 1) / width * b for b in allreduce_bytes) if width > 1 else 0.0
    return "pipeline-inner" if pipeline >= data else "data-inner"


# -- enumeration -----------------------------------------------------------------------

def _splits(topology: Topology, depth: int) -> Iterator[tuple[int, ...]]:
    """Per level the pipeline share ``a_k``, a divisor of ``m_k``, with ``prod a = d``."""
    machines = [level.machines for level in topology.levels]

    def shares(k: int, left: int) -> Iterator[tuple[int, ...]]:
        if k == len(machines):
            if left == 1:
                yield ()
            return
        for a in range(1, machines[k] + 1):
            if machines[k] % a == 0 and left % a == 0:
                for rest in shares(k + 1, left // a):
                    yield (a, *rest)

    return shares(0, depth)


def _table(topology: Topology, split: tuple[int, ...]) -> Table:
    """Ranks of the split ``a``: on level ``k`` the digit is ``p_k + a_k q_k`` (the order of
    the two digits inside a level changes no link, so one order is enough)."""
    machines = [level.machines for level in topology.levels]
    depth, width = math.prod(split), math.prod(m // a for m, a in zip(machines, split))
    table = [[0] * width for _ in range(depth)]
    for stage in range(depth):
        for replica in range(width):
            rank, size, s, q = 0, 1, stage, replica
            for a, m in zip(split, machines):
                rank += (s % a + a * (q % (m // a))) * size
                s, q, size = s // a, q // (m // a), size * m
            table[stage][replica] = rank
    return tuple(tuple(row) for row in table)


def _digits(topology: Topology, ranks: Sequence[int]) -> tuple[int, ...]:
    """Per level, how many distinct digits ``ranks`` use."""
    out, size = [], 1
    for level in topology.levels:
        out.append(len({(r // size) % level.machines for r in ranks}))
        size *= level.machines
    return tuple(out)


# -- pricing ---------------------------------------------------------------------------

def _level_between(topology: Topology, one: int, other: int) -> int:
    """The highest level (0-based) whose digit differs between two ranks; -1 if equal."""
    highest, size = -1, 1
    for k, level in enumerate(topology.levels):
        if (one // size) % level.machines != (other // size) % level.machines:
            highest = k
        size *= level.machines
    return highest


def _priced(topology: Topology, table: Table, p2p: Sequence[float], reduce: Sequence[float],
            *, runtime: Table, chosen: Table, data_inner: Table
            ) -> Placement:
    name = ("pipeline-inner" if table == runtime else
            "data-inner" if table == data_inner else "mixed")
    depth, width = len(table), len(table[0])
    bandwidth = [level.bandwidth for level in topology.levels]
    links = tuple(min(bandwidth[_level_between(topology, table[s][q], table[s + 1][q])]
                      for q in range(width)) for s in range(depth - 1))
    spans = [max(_level_between(topology, table[s][0], rank) for rank in table[s])
             for s in range(depth)]
    groups = tuple(bandwidth[k] if k >= 0 else math.inf for k in spans)
    return Placement(
        name=name, table=table, pipeline_split=_digits(topology, [row[0] for row in table]),
        data_split=_digits(topology, table[0]),
        p2p_bandwidth=links, allreduce_bandwidth=groups,
        p2p_time=sum(b / link for b, link in zip(p2p, links) if not math.isinf(link)),
        allreduce_time=max((allreduce_time(b, width, g) for b, g in zip(reduce, groups)),
                           default=0.0),
        runtime=table == runtime, wpipe_rule=table == chosen,
    )


def _check(topology: Topology, depth: int, width: int, p2p_bytes: float | Sequence[float],
           allreduce_bytes: float | Sequence[float]) -> tuple[list[float], list[float]]:
    for label, value in (("depth", depth), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{label} must be an integer >= 1, got {value!r}")
    if depth * width != topology.workers:
        raise ValueError(f"depth x width = {depth} x {width} = {depth * width} ranks but the "
                         f"topology {topology} has {topology.workers} workers; choose d and w "
                         f"with d x w = {topology.workers}")

    def per(label: str, value: float | Sequence[float], count: int, what: str) -> list[float]:
        values = [float(value)] * count if isinstance(value, (int, float)) else \
            [float(v) for v in value]
        if len(values) != count:
            raise ValueError(f"{label} has {len(values)} values; give one number or one per "
                             f"{what} ({count})")
        if any(not v >= 0 or math.isinf(v) for v in values):
            raise ValueError(f"{label} must be finite byte counts >= 0, got {values}")
        return values

    return (per("p2p_bytes", p2p_bytes, depth - 1, "boundary"),
            per("allreduce_bytes", allreduce_bytes, depth, "stage"))
