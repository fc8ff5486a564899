"""Planner methods by name, and :func:`make_plan`: request -> timed, simulated :class:`PlanResult`.

``make_plan`` runs the method (timing it: ``planning_seconds``), applies AutoPipe's Slicer when
asked (Algorithm 2's ``k`` from the plan's stage costs, schedule ``sliced-1f1b``), builds the
runtime's :class:`~pipeweave.planner.plan.Plan`, simulates it for the predicted iteration time
and, with a memory limit, checks every rank's peak by the memory model
(:func:`.memory.predicted_memory`: parameters, gradients, optimizer state, weight copies, held
activations, messages in flight) against it.

``schedule="fastest"`` (:data:`FASTEST`) keeps the method's partition and picks, among the
registered synchronous schedules that run one stage per rank (1F1B, GPipe, the zero-bubble
``zb-h1``/``zb-h2`` with a split backward, ...), the one the simulator predicts fastest for it
within the memory limit, the method's own schedule winning ties. They all train alike (same
gradients per update), so only time and memory differ. Schedules that need another partition
(two chunks per rank: interleaving, V shapes) are ``pipeweave auto``'s to choose.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from .plan import Plan
from ..schedules import available_schedules, get_info
from ..schedules.sliced import slicer_count
from ..sim import Costs, SimulationResult, simulate
from . import methods
from .evaluate import Evaluator, Network, plan_costs, sharing_overhead_of
from .partition import Bounds
from .slicer_halves import halves_at
from .memory import predicted_memory
from .result import Partition, PlanRequest, PlanResult

__all__ = ["MethodInfo", "register_method", "available_methods", "get_method", "make_plan",
           "FASTEST"]

FASTEST = "fastest"
"""The schedule name that asks :func:`make_plan` to choose the schedule (module docstring)."""

Method = Callable[[PlanRequest], Partition]


@dataclass(frozen=True)
class MethodInfo:
    name: str
    description: str
    paper: str
    run: Method


_METHODS: dict[str, MethodInfo] = {}


def register_method(name: str, *, description: str, paper: str) -> Callable[[Method], Method]:
    """Decorator registering a planner method under ``name``."""

    def decorate(fn: Method) -> Method:
        if name in _METHODS:
            raise ValueError(f"planner method {name!r} is registered twice")
        _METHODS[name] = MethodInfo(name, description, paper, fn)
        return fn

    return decorate


def available_methods() -> list[str]:
    return sorted(_METHODS)


def get_method(name: str) -> MethodInfo:
    try:
        return _METHODS[name]
    except KeyError:
        raise ValueError(f"unknown planner method {name!r}; choose one of "
                         f"{', '.join(available_methods())}") from None


register_method("uniform", description="equal block counts per stage",
                paper="Megatron-LM")(methods.uniform)
register_method("parameters", description="balance parameter bytes (min-max)",
                paper="DeepSpeed partition_method='parameters'")(methods.parameters)
register_method("time", description="balance forward+backward time (min-max)",
                paper="torchgpipe balance_by_time")(methods.time)
register_method("pipedream", description="DP over a hierarchical topology with replication",
                paper="pipedream.txt §3.1")(methods.pipedream)
register_method("autopipe", description="Algorithm 1 + simulator-driven master-stage search",
                paper="autopipe.txt §III-B")(methods.autopipe)


def make_plan(request: PlanRequest, method: str) -> PlanResult:
    """Plan ``request`` with ``method`` (see the module docstring)."""
    info = get_method(method)
    started = time.perf_counter()
    # With "fastest" the method partitions for its own schedule; the choice comes after.
    partition = info.run(replace(request, schedule=None) if request.schedule == FASTEST
                         else request)
    if request.schedule == FASTEST and request.slicer:
        raise ValueError("--slicer runs sliced-1f1b and --schedule fastest chooses the schedule; "
                         "give one of them")
    if request.schedule is not None and request.schedule != FASTEST:
        get_info(request.schedule)  # unknown names fail here, with the list of known ones
        partition = replace(partition, schedule=request.schedule)
    network = partition.network or methods.straight_network(request)
    details: dict[str, Any] = dict(partition.details)
    if request.shared_cores is not None:
        details["shared_cores"] = request.shared_cores
        details["sharing_overhead"] = sharing_overhead_of(request.profile)
    if request.slicer:
        partition = _apply_slicer(request, partition, network, details)
    microbatches = partition.microbatches or request.num_microbatches
    if request.schedule == FASTEST:
        partition = _fastest_schedule(request, partition, network, microbatches, details)
    seconds = time.perf_counter() - started

    plan = Plan(num_blocks=request.profile.num_blocks, stages=partition.bounds,
                schedule=partition.schedule, microbatches=microbatches,
                replicas=partition.replicas, schedule_options=dict(partition.schedule_options))
    simulation = _simulate(request, partition, network, microbatches)
    if request.memory_limit is not None and partition.replicas is None:
        _check_memory(request, partition, microbatches)
    replicas = partition.replicas or (1,) * len(partition.bounds)
    compute = request.profile.compute
    stage_times = tuple(sum(compute[a:e]) / r for (a, e), r in zip(partition.bounds, replicas))
    return PlanResult(method=method, plan=plan, stage_times=stage_times,
                      predicted_iteration_time=simulation.iteration_time,
                      planning_seconds=seconds, details=details)


def _fastest_schedule(request: PlanRequest, partition: Partition, network: Network,
                      microbatches: int, details: dict[str, Any]) -> Partition:
    """The partition with the synchronous one-stage-per-rank schedule predicted fastest within
    the memory limit; ``details["schedules"]``: every one tried, its predicted iteration time
    in seconds, or why it was left out."""
    own = get_info(partition.schedule)
    names = [own.name] if own.synchronous else []
    names += [info.name for info in available_schedules()
              if info.synchronous and info.default_chunks == 1 and info.name not in names]
    tried: dict[str, float | str] = {}
    best: tuple[float, Partition] | None = None
    for name in names:
        candidate = replace(partition, schedule=name)
        try:
            simulation = _simulate(request, candidate, network, microbatches)
            if request.memory_limit is not None and candidate.replicas is None:
                _check_memory(request, candidate, microbatches)
        except ValueError as error:  # needs more micro-batches, over the memory limit, ...
            tried[name] = str(error).split(";")[0]
            continue
        tried[name] = simulation.iteration_time
        if best is None or simulation.iteration_time < best[0]:
            best = (simulation.iteration_time, candidate)
    details["schedules"] = tried
    if best is None:
        reasons = "; ".join(f"{name}: {why}" for name, why in tried.items())
        raise ValueError(f"--schedule fastest: no synchronous schedule fits this plan ({reasons}); "
                         f"raise --memory-limit or use more ranks")
    return best[1]


def _simulate(request: PlanRequest, partition: Partition, network: Network,
              microbatches: int) -> SimulationResult:
    evaluator = Evaluator(request.profile, partition.schedule, len(partition.bounds),
                          microbatches, network, partition.replicas,
                          dict(partition.schedule_options))
    if request.half_profile is None or get_info(partition.schedule).sliced != partition.schedule:
        return evaluator(partition.bounds)
    return simulate(evaluator.built(), _sliced_costs(request, partition.bounds, network))


def _sliced_costs(request: PlanRequest, bounds: Bounds, network: Network) -> Costs:
    """The stages' costs, with their halves priced from ``request.half_profile`` where there
    is one (:func:`.slicer_halves.halves_at`), else half the whole (the simulator's default)."""
    costs = plan_costs(request.profile, bounds, network)
    if request.half_profile is None:
        return costs
    return halves_at(costs, len(bounds), request.half_profile,
                     lambda profile: plan_costs(profile, bounds, network))


def _apply_slicer(request: PlanRequest, partition: Partition, network: Network,
                  details: dict[str, Any]) -> Partition:
    """AutoPipe's Slicer (autopipe.txt §III-C): ``sliced-1f1b`` with Algorithm 2's ``k``,
    from the stages' costs and their halves' (:func:`_sliced_costs`)."""
    sliced = get_info(partition.schedule).sliced
    if sliced is None or partition.replicas is not None:
        raise ValueError(
            f"the Slicer splits the warm-up micro-batches of a 1F1B pipeline; this plan runs "
            f"{partition.schedule!r}{' with replicated stages' if partition.replicas else ''}. "
            "Drop --slicer, or plan with a 1F1B method (uniform, parameters, time, autopipe)"
        )
    microbatches = partition.microbatches or request.num_microbatches
    costs = _sliced_costs(request, partition.bounds, network).resolve(len(partition.bounds))
    transfers = [request.profile.blocks[e - 1].output_bytes / network.boundary(s)
                 for s, (_, e) in enumerate(partition.bounds[:-1])]
    # Algorithm 2 takes one Comm for every boundary (§III-B): the mean transfer time.
    comm = network.latency + (sum(transfers) / len(transfers) if transfers else 0.0)
    k = min(slicer_count(costs.forward, costs.backward, comm,
                         half_forward=costs.half_forward or None,
                         half_backward=costs.half_backward or None), microbatches)
    plain = _simulate(request, replace(partition, schedule="1f1b"), network, microbatches)
    details["sliced"] = k
    details["iteration_time_without_slicer"] = plain.iteration_time
    options = {**dict(partition.schedule_options), "sliced": k}
    return replace(partition, schedule=sliced, schedule_options=options)


def _check_memory(request: PlanRequest, partition: Partition, microbatches: int) -> None:
    """Every rank's peak by the memory model (:func:`.memory.predicted_memory`, what ``auto``
    asks) within the limit; the profile is taken at the plan's micro-batch size, with the
    optimizer it was profiled with."""
    assert request.memory_limit is not None
    profile = request.profile
    plan = Plan(num_blocks=profile.num_blocks, stages=partition.bounds,
                schedule=partition.schedule, microbatches=microbatches,
                schedule_options=dict(partition.schedule_options))
    ranks = predicted_memory(profile, plan, batch_size=(profile.batch_size or 1) * microbatches,
                             optimizer=None)
    for rank, memory in enumerate(ranks):
        if memory.total > request.memory_limit:
            fixed = memory.parameters + memory.optimizer_state + memory.weight_versions
            raise ValueError(
                f"the {partition.schedule} plan {list(map(list, partition.bounds))} needs "
                f"{memory.total:.6g} bytes on rank {rank} (parameters, optimizer state and "
                f"weight copies {fixed:.6g}, held activations {memory.activations:.6g}) but "
                f"--memory-limit is {request.memory_limit:.6g}; raise the limit, use more ranks, "
                "fewer micro-batches, or a memory-aware method (time, autopipe, pipedream)"
            )
