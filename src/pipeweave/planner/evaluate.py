"""From a profile and a partition to simulator costs, and the simulated iteration time.

Every planner is judged the same way: the plan's schedule is simulated
(:func:`pipeweave.sim.simulate`) with per-stage costs summed from the profile::

    forward[s]  = sum of the blocks' forward times      backward[s] likewise
    comm[s]     = output_bytes(last block of s) / bandwidth(boundary s)   (+ latency)
    all_reduce  = 4 (r-1) |w_s| / (r B)  for a stage with r replicas   (pipedream.txt §3.1)
    update[s]   = sum of the blocks' optimizer-step times
    weight_grad[s] = sum of the blocks' weight-gradient (W) times, a block's backward / 2
                  where the profile does not know it (split-backward schedules)
    input_grad[s]  = sum of the blocks' input-gradient (I) times, backward - W where unknown
    (forward, backward and update times x the profile's ``sharing_overhead`` when the ranks
    share CPU cores, ``Network.shared_cores``)
    runtime     where the profile measured them (``profile.runtime``): each of forward,
                backward, I, W and update of a stage of k blocks + per_action + per_block (k-1),
                F, B, I and W + compute_per_action (a distributed run's own, fitted),
                F, B and I that take a message from another rank + compute_per_receive,
                F, B, I and W (their sends included) then x compute_scale (x the
                factor of the stage's micro-batch size, RuntimeCosts.size_scales),
                and a stage that sends (forward to the next, gradient to the previous) pays
                per_message in that action; then each F, B, I and W + action_overhead,
                and + action_overhead again where it sends; every transfer's latency grows by
                message_latency; an all-reduce is allreduce_latency + (r-1)|w_s| /
                allreduce_bandwidth where those were measured (at least the ring formula),
                else each of its 2 (r - 1) ring steps waits message_latency;
                with shared cores, wait_share goes to the costs (a waiting rank's share
                of a core, :mod:`pipeweave.sim.shared_cores`)
                (:mod:`pipeweave.profiler.runtime_costs`)
    activation  = sum of the blocks' activation bytes (what a stage stashes per micro-batch)
    tie sum     update[s] += latency + |tie| / bandwidth, once per rank, on each stage s
                holding a tied parameter (``Profile.ties``) the partition splits over ranks:
                the runtime sums the copies' gradients among the holders before each
                update (runtime/execution/ties.py), one message of the tied bytes each way
                over the slowest boundary between the first and the last holder (the link
                the straight placement puts between them); holders on one rank add locally
    (a stage's parameter bytes count a tie held by several of its blocks once)
    sharded     a plan whose stages FSDP2 shards over their replicas (``Plan.shard``): the
                gathers in each forward (and each B, I and W, ``full``) and a reduce-scatter in
                place of the all-reduce (:mod:`.sharded_costs`)
    tensor      a plan whose stages are split over ``tp`` processes (``Plan.tp``): the costs
    parallel    of one of them, the compute of split blocks / tp plus the plan's activation
                all-reduces over ``Network.tp_bandwidth`` (:mod:`.tp_costs`)

:class:`Evaluator` builds the schedule once and re-times it for each candidate partition,
which is what AutoPipe's search loop needs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..ir import Action, Schedule
from ..ir.walk import Location, index_actions
from ..profiler import Profile
from ..schedules import Shape, build_schedule, get_info
from ..sim import Costs, PathTiming, SimulationResult, simulate, simulate_path
from ..sim.compiled import expect_timings
from ..sim.path_arrays import flush_graph, path_arrays
from .block_columns import block_columns
from .partition import Bounds
from .pipedream import allreduce_time
from .sharded_costs import sharded_times
from .tp_costs import tp_profile

__all__ = ["Network", "plan_costs", "tie_sums", "Evaluator", "simulated_iterations",
           "sharing_overhead_of"]


@dataclass(frozen=True)
class Network:
    """Links between stages and among replicas.

    Attributes:
        bandwidth: bytes/s between consecutive stages: one number, or one per boundary
            (``inf``: communication is free).
        latency: seconds added to every transfer.
        allreduce_bandwidth: bytes/s among a stage's replicas: one number or one per stage
            (default: ``bandwidth`` when it is one number, else free).
        shared_cores: CPU cores all ranks share (processes on one CPU machine); ``None``:
            every rank has its own device (see ``Costs.shared_cores``).
    """

    bandwidth: float | Sequence[float] = math.inf
    latency: float = 0.0
    allreduce_bandwidth: float | Sequence[float] | None = None
    shared_cores: int | None = None
    tp_bandwidth: float | None = None
    """Bytes/s among a stage's tensor-parallel processes (``None``: ``bandwidth`` when it is
    one number, else free); read when ``plan_costs`` is given ``tp > 1``."""

    def boundary(self, index: int) -> float:
        return float(self.bandwidth if isinstance(self.bandwidth, (int, float))
                     else self.bandwidth[index])

    def replicas(self, stage: int) -> float:
        value = self.allreduce_bandwidth
        if value is None:
            value = self.bandwidth if isinstance(self.bandwidth, (int, float)) else math.inf
        return float(value if isinstance(value, (int, float)) else value[stage])


def plan_costs(profile: Profile, bounds: Bounds, network: Network = Network(),
               replicas: Sequence[int] | None = None,
               stage_ranks: Sequence[Sequence[int]] | None = None,
               shard: str = "none", tp: int = 1) -> Costs:
    """Per-stage simulator costs of ``bounds`` (module docstring); ``stage_ranks``: the ranks
    of each stage (default: a rank each), which says which tie holders share a rank;
    ``shard``: how the stages are held over their ``replicas`` (``Plan.shard``); ``tp``: the
    stages split over that many tensor-parallel processes (``Plan.tp``), costed as one of
    them (:func:`.tp_costs.tp_profile` at ``network.tp_bandwidth``)."""
    if tp > 1:
        link = network.tp_bandwidth
        if link is None:
            link = network.bandwidth if isinstance(network.bandwidth, (int, float)) else math.inf
        profile = tp_profile(profile, tp, bandwidth=float(link), latency=network.latency)
    blocks = profile.blocks
    overhead = sharing_overhead_of(profile) if network.shared_cores is not None else 1.0
    # per block, read once per profile (block_columns), summed per stage as before
    column = block_columns(profile)
    forward = [overhead * sum(column.forward[a:e]) for a, e in bounds]
    backward = [overhead * sum(column.backward[a:e]) for a, e in bounds]
    activation = [sum(column.activation[a:e]) for a, e in bounds]
    update = [overhead * sum(column.update[a:e]) for a, e in bounds]
    # W, the weight-gradient half of a split backward, where the profile measured it (blocks
    # with 0 are unknown: they count half their backward, the simulator's default)
    weight = [overhead * sum(column.weight[a:e]) for a, e in bounds]
    comm = [blocks[e - 1].output_bytes / network.boundary(s) if not math.isinf(network.boundary(s))
            else 0.0 for s, (_, e) in enumerate(bounds[:-1])]
    reduce = [0.0] * len(bounds)
    if replicas is not None:
        reduce = [allreduce_time(profile.stage_parameter_bytes(a, e), r, network.replicas(s))
                  for s, ((a, e), r) in enumerate(zip(bounds, replicas))]
        if profile.runtime is not None:  # as measured, or a ring's steps each wait a message
            runtime = profile.runtime
            reduce = [runtime.all_reduce(profile.stage_parameter_bytes(a, e), r, t)
                      for (a, e), r, t in zip(bounds, replicas, reduce)]
    for s, seconds in tie_sums(profile, bounds, network, stage_ranks).items():
        update[s] += seconds
    weight = [min(w, b) for w, b in zip(weight, backward)]  # measured W can exceed B by noise
    # I likewise; measured halves usually add up to more than one whole backward
    inputs = [overhead * sum(column.input[a:e]) for a, e in bounds]
    if profile.runtime is not None:
        forward, backward, weight, inputs, update = _with_runtime(
            profile, bounds, forward, backward, weight, inputs, update, overhead=overhead,
            stage_ranks=stage_ranks)
        weight = [min(w, b) for w, b in zip(weight, backward)]
    if shard != "none" and replicas is not None:
        forward, backward, weight, inputs, reduce = _sharded(
            profile, bounds, network, replicas, shard, forward, backward, weight, inputs)
    return Costs(forward=forward, backward=backward, weight_grad=weight, input_grad=inputs,
                 comm=comm or 0.0,
                 latency=network.latency + (profile.runtime.message_latency
                                            if profile.runtime is not None else 0.0),
                 activation_bytes=activation, all_reduce=reduce, update=update,
                 shared_cores=network.shared_cores,
                 wait_share=profile.runtime.wait_share if profile.runtime is not None else 0.0)


def _sharded(profile: Profile, bounds: Bounds, network: Network, replicas: Sequence[int],
             shard: str, forward: list[float], *backwards: list[float]
             ) -> tuple[list[float], ...]:
    """``forward``, the ``backwards`` (``B``, ``W``, ``I``: each gathers as a ``B`` does)
    and the reduction of a sharded plan (module docstring)."""
    latency = profile.runtime.message_latency if profile.runtime is not None else 0.0
    times = sharded_times(profile, bounds, shard, replicas,
                          [network.replicas(s) for s in range(len(bounds))], latency)
    return ([f + g for f, g in zip(forward, times.forward)],
            *([b + g for b, g in zip(column, times.backward)] for column in backwards),
            list(times.reduce))


def _with_runtime(profile: Profile, bounds: Bounds, *columns: list[float],
                  overhead: float = 1.0, stage_ranks: Sequence[Sequence[int]] | None = None
                  ) -> tuple[list[float], ...]:
    """``forward, backward, weight, inputs, update`` with the runtime's fixed costs (module
    docstring); the sharing overhead scales them like the compute they are part of. A stage
    posts a send where its neighbour is on other ranks (``stage_ranks``; default: a rank
    each)."""
    runtime = profile.runtime
    assert runtime is not None
    kinds = ("forward", "backward", "weight_grad", "input_grad", "update")
    message = runtime.per_message
    ranks = [set(r) for r in stage_ranks] if stage_ranks is not None else \
        [{s} for s in range(len(bounds))]
    ahead = [s + 1 < len(bounds) and ranks[s + 1] != ranks[s] for s in range(len(bounds))]
    behind = [s > 0 and ranks[s - 1] != ranks[s] for s in range(len(bounds))]
    out = []
    for kind, column in zip(kinds, columns):
        sends = {"forward": ahead, "backward": behind, "input_grad": behind}.get(kind)
        values = []
        scale = runtime.compute_scale * runtime.size_factor(profile.batch_size) \
            if kind != "update" else 1.0
        fixed = runtime.action_overhead if kind != "update" else 0.0
        per_action = runtime.compute_per_action if kind != "update" else 0.0
        takes = {"forward": behind, "backward": ahead, "input_grad": ahead}.get(kind)
        for s, ((a, e), value) in enumerate(zip(bounds, column)):
            timed = runtime.action(kind, value / overhead, e - a) + per_action
            if takes is not None and takes[s]:
                timed += runtime.compute_per_receive
            posts = sends is not None and sends[s]
            if posts:
                timed += message
            values.append(overhead * timed * scale + fixed * (2 if posts else 1))
        out.append(values)
    return tuple(out)


def tie_sums(profile: Profile, bounds: Bounds, network: Network = Network(),
             stage_ranks: Sequence[Sequence[int]] | None = None) -> dict[int, float]:
    """Seconds each stage's update spends summing tied copies with the other holders
    (module docstring): on the first holding stage of each rank, per tie the partition
    splits over ranks."""
    ranks = [tuple(r) for r in stage_ranks] if stage_ranks is not None else \
        [(s,) for s in range(len(bounds))]
    out: dict[int, float] = {}
    for tie in profile.ties:
        stages = tie.stages(bounds)
        if len({ranks[s][0] for s in stages}) < 2:
            continue  # one holder, or all on one rank: summed locally
        slowest = min(network.boundary(b) for b in range(stages[0], stages[-1]))
        latency = network.latency + (profile.runtime.message_latency
                                     if profile.runtime is not None else 0.0)
        seconds = latency + (tie.parameter_bytes / slowest if not math.isinf(slowest) else 0.0)
        first: dict[int, int] = {}
        for s in stages:
            first.setdefault(ranks[s][0], s)
        for s in first.values():
            out[s] = out.get(s, 0.0) + seconds
    return out


def sharing_overhead_of(profile: Profile) -> float:
    """The compute-time factor a co-located profile measured for ranks sharing the cores
    (``metadata["sharing_overhead"]``, see ``profiler.colocated``); 1 without one."""
    value = profile.metadata.get("sharing_overhead", 1.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 1.0:
        raise ValueError(f"profile metadata sharing_overhead={value!r} is not a number >= 1; "
                         f"profile again with `pipeweave profile --colocated-ranks R`")
    return float(value)


def simulated_iterations(schedule: str) -> int:
    """Iterations to lay out: 1 for a flush schedule, 4 for an asynchronous one (steady state)."""
    return 1 if get_info(schedule).synchronous else 4


@dataclass
class Evaluator:
    """Simulates one schedule shape under many partitions (the schedule is built once)."""

    profile: Profile
    schedule: str
    stages: int
    microbatches: int
    network: Network = Network()
    replicas: tuple[int, ...] | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    calls: int = 0
    _built: Schedule | None = None
    _index: dict[Action, Location] | None = None

    def built(self) -> Schedule:
        if self._built is None:
            self._built = build_schedule(
                self.schedule, stages=self.stages, microbatches=self.microbatches,
                iterations=simulated_iterations(self.schedule), replicas=self.replicas,
                options=dict(self.options),
            )
        return self._built

    def __call__(self, bounds: Bounds) -> SimulationResult:
        self.calls += 1
        return simulate(self.built(), plan_costs(self.profile, bounds, self.network, self.replicas))

    def path(self, bounds: Bounds) -> PathTiming:
        """The iteration time and master stage alone (:func:`pipeweave.sim.simulate_path`,
        the same numbers as :meth:`__call__`'s), the action index built once; a flush shape
        the columns cover is timed there, built and compiled once per shape in numpy
        (:mod:`pipeweave.sim.path_arrays`, the same numbers)."""
        self.calls += 1
        costs = plan_costs(self.profile, bounds, self.network, self.replicas)
        if costs.shared_cores is None or costs.shared_cores >= self.stages:
            graph = flush_graph(self.schedule, Shape(  # ranks sharing cores: walked (None)
                stages=self.stages, microbatches=self.microbatches,
                iterations=simulated_iterations(self.schedule), replicas=self.replicas,
                options=dict(self.options)))
            if graph is not None and (timed := path_arrays(graph, costs)) is not None:
                return timed
        if self._index is None:
            self._index = index_actions(self.built())
            expect_timings(self.built())  # timed split after split: compiled at once
        return simulate_path(self.built(), costs, index=self._index)
