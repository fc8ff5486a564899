"""The partitioner methods, one function each: ``PlanRequest -> Partition``.

==========  ==========================================================  ======================
name        what it balances                                             from
==========  ==========================================================  ======================
uniform     equal block counts per stage                                 Megatron-LM
parameters  parameter bytes per stage (min-max)                          DeepSpeed
time        forward + backward time per stage (min-max)                  torchgpipe
pipedream   slowest stage incl. communication, with replication (DP)     pipedream.txt §3.1
autopipe    simulated iteration time: Algorithm 1 + master-stage search  autopipe.txt §III-B
==========  ==========================================================  ======================

Every method but ``pipedream`` puts one stage on each rank and runs ``1f1b``; ``pipedream``
replicates stages and runs PipeDream's asynchronous 1F1B-RR (``pipedream``), whose
micro-batch count must be a multiple of every replica count.
"""

from __future__ import annotations

import math

import numpy as np

from .autopipe import autopipe_search
from .evaluate import Evaluator, Network
from .memory import held_microbatches as planned_held
from .partition import FeasibleFn, min_max_partition, uniform_partition
from .pipedream_cache import pipedream_solution
from .result import Partition, PlanRequest
from .topology import Topology

__all__ = ["uniform", "parameters", "time", "pipedream", "autopipe", "held_microbatches",
           "memory_mask", "straight_network"]


def uniform(request: PlanRequest) -> Partition:
    return Partition(uniform_partition(request.profile.num_blocks, request.ranks), "1f1b")


def parameters(request: PlanRequest) -> Partition:
    weights = request.profile.parameter_bytes
    if not any(weights):
        return Partition(uniform_partition(len(weights), request.ranks), "1f1b",
                         details={"note": "no parameters in the profile: equal block counts"})
    bounds, heaviest = min_max_partition(weights, request.ranks)
    return Partition(bounds, "1f1b", details={"max_stage_parameter_bytes": heaviest})


def time(request: PlanRequest) -> Partition:
    schedule = request.schedule or "1f1b"
    bounds, heaviest = min_max_partition(
        request.profile.compute, request.ranks,
        feasible=memory_mask(request, schedule) if request.memory_limit is not None else None,
    )
    return Partition(bounds, "1f1b", details={"max_stage_time": heaviest})


def autopipe(request: PlanRequest) -> Partition:
    profile = request.profile
    schedule = "1f1b"  # the search runs on 1F1B; the Slicer, if asked, is applied afterwards
    evaluator = Evaluator(profile, schedule, request.ranks, request.num_microbatches,
                          straight_network(request))
    search = autopipe_search(
        evaluator.path, profile.forward, profile.backward, request.ranks,
        feasible=memory_mask(request, schedule) if request.memory_limit is not None else None,
    )
    compute = profile.compute
    start_times = [sum(compute[a:e]) for a, e in search.start]
    return Partition(search.bounds, schedule, details={
        "algorithm1_stages": [list(s) for s in search.start],
        "algorithm1_iteration_time": search.start_result.iteration_time,
        "algorithm1_balance": max(start_times) / (sum(start_times) / len(start_times)),
        "algorithm1_master_stage": search.start_result.master_stage,
        "master_stage": search.result.master_stage,
        "simulations": search.simulations,
    })


def pipedream(request: PlanRequest) -> Partition:
    profile = request.profile
    topology = request.resolved_topology()
    solution = pipedream_solution(  # remembered across power-of-two micro-batch sizes
        tuple(profile.compute), tuple(profile.parameter_bytes), tuple(profile.output_bytes),
        tuple(b.activation_bytes for b in profile.blocks),
        tuple(b.optimizer_bytes for b in profile.blocks),
        topology, straight=request.straight, overlap=request.allreduce_overlap,
        memory_limit=request.memory_limit,
    )
    rounds = math.lcm(*solution.replicas)
    microbatches = rounds * -(-request.num_microbatches // rounds)
    bandwidths = [level.bandwidth for level in topology.levels]
    network = Network(
        bandwidth=[bandwidths[level - 1] for level in solution.boundary_levels],
        latency=request.latency,
        shared_cores=request.shared_cores,
        allreduce_bandwidth=[bandwidths[level - 1] if level else math.inf
                             for level in solution.replica_levels],
    )
    return Partition(
        solution.bounds, "pipedream",
        replicas=solution.replicas if any(r > 1 for r in solution.replicas) else None,
        microbatches=microbatches, network=network,
        details={
            "predicted_time_per_minibatch": solution.time_per_minibatch,
            "noam": solution.noam,
            "top_level_stages": [list(s) for s in solution.top_level],
            "pipedream_stage_times": list(solution.stage_times),
            "topology": topology.to_json(),
            "straight": request.straight,
        },
    )


def held_microbatches(schedule: str, stages: int, microbatches: int, stage: int) -> float:
    """Micro-batches stage ``stage`` (on rank ``stage``) keeps activations for at once, read
    off the schedule by the memory model (:func:`.memory.held_microbatches`): GPipe all
    ``M``, 1F1B ``min(P - s, M)`` (its warm-up depth), ..."""
    return planned_held(schedule, stages, microbatches)[stage]


def memory_mask(request: PlanRequest, schedule: str) -> FeasibleFn:
    """``feasible(j)[k, i]``: stage ``j`` holding blocks ``k..i-1`` fits ``memory_limit``.

    A stage keeps its parameters, their gradients, its optimizer state and the activations
    (saved tensors and output) of the micro-batches in flight (:func:`held_microbatches`):
    the memory model's parts that add up block by block (messages in flight and the
    backward's workspace left out); :func:`.registry.make_plan` then checks the partition's
    plan against the model itself (:func:`.memory.predicted_memory`).
    """
    assert request.memory_limit is not None
    blocks = request.profile.blocks

    def spans(values: list[float]) -> np.ndarray:
        prefix = np.concatenate(([0.0], np.cumsum(values)))
        out: np.ndarray = prefix[None, :] - prefix[:, None]
        return out

    # parameters, their gradients and the optimizer state; per held micro-batch the saved
    # tensors and the stage's output (none on the last stage: the loss)
    fixed = spans([2 * b.parameter_bytes + b.optimizer_bytes for b in blocks])
    stash = spans(list(request.profile.stash_bytes))
    output = np.array([0.0] + [b.output_bytes for b in blocks])[None, :]
    limit = float(request.memory_limit)
    stages, microbatches = request.ranks, request.num_microbatches
    counts = planned_held(schedule, stages, microbatches)

    def feasible(stage: int) -> np.ndarray:
        kept = stash + (output if stage < stages - 1 else 0.0)
        mask: np.ndarray = fixed + counts[stage] * kept <= limit
        return mask

    return feasible


def straight_network(request: PlanRequest) -> Network:
    """Links of a straight pipeline with stage ``s`` on rank ``s``, ranks filling the lowest
    level first: the boundary after rank ``s`` crosses the highest level ``k`` whose
    component size divides ``s + 1``."""
    topology: Topology = request.resolved_topology()
    sizes, size = [], 1
    for level in topology.levels:
        sizes.append(size)
        size *= level.machines
    bandwidths = []
    for s in range(request.ranks - 1):
        crossed = max(k for k, component in enumerate(sizes) if (s + 1) % component == 0)
        bandwidths.append(topology.levels[crossed].bandwidth)
    return Network(bandwidth=bandwidths if bandwidths else math.inf, latency=request.latency,
                   shared_cores=request.shared_cores)
