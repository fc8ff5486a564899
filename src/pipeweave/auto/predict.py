"""One candidate, predicted: its plan, its simulator costs, its simulated time and memory.

The costs are :func:`pipeweave.planner.evaluate.plan_costs` of the profile scaled to the
candidate's micro-batch (:mod:`pipeweave.auto.scaling`) on the links its layout crosses
(:mod:`pipeweave.auto.links`), with two adjustments the planner does not make::

    recompute   backward[s] += forward[s]   on each stage s that recomputes (the first
                input_grad[s] += forward[s]  ``candidate.recompute``): the backward first re-runs
                                             the forward (in a split backward the I does), and the
                                             stage keeps only its input per micro-batch:
                                             activation[s] = bytes entering s (pipeweave's
                                             recomputation is per stage,
                                             runtime/execution/stage.py)
    apc         transfer time / 2            (fp16 instead of fp32 on the wire, WPipe §A.3;
                                             the latency stays)
                forward[s], backward[s] and  the codec's work, half a round trip at each end
                input_grad[s] += c[s]        of every message crossing ranks:
                                             c[s] = (m[s-1] + m[s]) / (2 R), m[b] the bytes
                                             across boundary b (0 where it stays on one rank
                                             or does not exist), R the profile's
                                             apc_bytes_per_second (unknown: c = 0); the F
                                             decodes its input and encodes its output, the
                                             B (its I when split) decodes the output gradient
                                             and encodes the input gradient

Schedule options the search can fill from the costs are filled (:data:`OPTION_PROVIDERS`):
a schedule that takes ``costs`` (AutoPipe's Slicer, Algorithm 2) gets the stage costs.
A sliced candidate's halves are priced at half the micro-batch (:mod:`.half_costs`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..planner.evaluate import plan_costs, simulated_iterations
from ..planner.plan import Plan
from ..profiler import Profile
from ..schedules import get_info
from ..sim import Costs
from .links import default_topology, layout_network
from .copies import copies_independent
from .half_costs import with_halves
from .memory import rank_memory
from .timing import time_plan
from .problem import AutoProblem, Candidate

__all__ = ["Prediction", "Timed", "apc_conversion", "candidate_plan", "candidate_costs",
           "predict", "simulate_candidate", "with_memory", "OPTION_PROVIDERS",
           "one_copy_suffices"]


@dataclass(frozen=True)
class Prediction:
    """What the simulator and the memory model say about one candidate."""

    candidate: Candidate
    plan: Plan
    iteration_time: float
    samples_per_second: float
    bubble_fraction: float
    peak_memory_bytes: tuple[float, ...]
    """Per rank: the memory model's total (parameters, gradients, optimizer state, weight
    versions, activations, buffers)."""

    @property
    def max_memory(self) -> float:
        return max(self.peak_memory_bytes)


def _stage_costs_option(costs: Costs, plan: Plan) -> Any:
    table = costs.resolve(len(plan.stages))
    comm = (sum(table.comm(s) for s in range(len(table.transfer))) / len(table.transfer)
            if table.transfer else 0.0)
    return [list(table.forward), list(table.backward), comm]


OPTION_PROVIDERS: Mapping[str, Callable[[Costs, Plan], Any]] = {"costs": _stage_costs_option}
"""Schedule options filled from the candidate's costs, by option name (any schedule that
registers the option gets it)."""


def candidate_plan(candidate: Candidate, problem: AutoProblem) -> Plan:
    """The runtime plan of a partitioned candidate (``bounds`` set)."""
    assert candidate.bounds is not None
    stages = len(candidate.bounds)
    return Plan(num_blocks=problem.profile.num_blocks, stages=candidate.bounds,
                schedule=candidate.schedule, microbatches=candidate.microbatches,
                chunks=candidate.chunks, replicas=candidate.replicas,
                width=1 if candidate.replicas is not None else candidate.width,
                pipelines=candidate.pipelines, shard=candidate.shard, tp=candidate.tp,
                recompute=candidate.recomputed(stages),
                schedule_options=dict(candidate.options))


def candidate_costs(candidate: Candidate, plan: Plan, profile: Profile,
                    problem: AutoProblem) -> Costs:
    """Simulator costs of ``plan`` (module docstring); ``profile`` is already scaled. A
    sliced plan's halves cost the same at half the micro-batch (:mod:`.half_costs`), with
    ``profile``'s runtime costs (a calibration may have fitted them)."""
    return with_halves(_costs_at(candidate, plan, profile, problem), plan, problem,
                       lambda half: _costs_at(candidate, plan,
                                              replace(half, runtime=profile.runtime), problem))


def _costs_at(candidate: Candidate, plan: Plan, profile: Profile,
              problem: AutoProblem) -> Costs:
    """:func:`candidate_costs` of ``plan`` under ``profile``, without half costs."""
    layout = plan.layout()
    topology = problem.topology or default_topology(profile, problem.ranks)
    latency = profile.link.latency if profile.link is not None else 0.0
    network = layout_network(topology, layout, latency=latency,
                             shared_cores=problem.shared_cores)
    replicas = tuple(layout.replicas(s) for s in range(layout.num_stages))
    costs = plan_costs(profile, plan.stages, network,
                       replicas if any(r > 1 for r in replicas) else None,
                       stage_ranks=layout.stage_ranks, shard=plan.shard, tp=plan.tp)
    if plan.recompute:
        costs = _recomputed(costs, plan, profile)
    if candidate.apc:
        costs = _compressed(costs, plan, profile)
    return costs


def apc_conversion(plan: Plan, profile: Profile) -> tuple[float, ...]:
    """Per stage, the seconds APC's codec adds to each F and each B (module docstring)."""
    stages = len(plan.stages)
    rate = profile.apc_bytes_per_second
    if rate is None:
        return (0.0,) * stages
    ranks = plan.layout().stage_ranks
    message = [profile.blocks[e - 1].output_bytes if set(ranks[s]) != set(ranks[s + 1]) else 0.0
               for s, (_, e) in enumerate(plan.stages[:-1])]
    return tuple(((message[s - 1] if s > 0 else 0.0) + (message[s] if s < stages - 1 else 0.0))
                 / (2 * rate) for s in range(stages))


def _compressed(costs: Costs, plan: Plan, profile: Profile) -> Costs:
    """``costs`` with APC: half the transfer, the codec's work on the F and B."""
    table = costs.resolve(len(plan.stages))
    codec = apc_conversion(plan, profile)
    return replace(
        costs, comm=tuple(t / 2 for t in table.transfer) or 0.0,
        forward=tuple(f + c for f, c in zip(table.forward, codec)),
        backward=tuple(b + c for b, c in zip(table.backward, codec)),
        input_grad=tuple(i + c for i, c in zip(table.input_grad, codec)),
        weight_grad=table.weight_grad)


def _recomputed(costs: Costs, plan: Plan, profile: Profile) -> Costs:
    """``costs`` with the forward added to the backward of each stage ``plan`` recomputes."""
    table = costs.resolve(len(plan.stages))
    on = plan.recompute
    entering = [profile.input_bytes if a == 0 else profile.blocks[a - 1].output_bytes
                for a, _ in plan.stages]
    return replace(
        costs,
        backward=tuple(b + (f if r else 0.0) for b, f, r in zip(table.backward, table.forward, on)),
        input_grad=tuple(i + (f if r else 0.0)
                         for i, f, r in zip(table.input_grad, table.forward, on)),
        weight_grad=table.weight_grad,
        activation_bytes=tuple(e if r else a
                               for e, a, r in zip(entering, table.activation_bytes, on)),
    )


def with_options(candidate: Candidate, profile: Profile, problem: AutoProblem) -> Candidate:
    """``candidate`` with the schedule options the search fills (:data:`OPTION_PROVIDERS`)."""
    wanted = [name for name in get_info(candidate.schedule).options if name in OPTION_PROVIDERS]
    if not wanted:
        return candidate
    plan = candidate_plan(candidate, problem)
    costs = candidate_costs(candidate, plan, profile, problem)
    options = {**dict(candidate.options),
               **{name: OPTION_PROVIDERS[name](costs, plan) for name in wanted}}
    return replace(candidate, options=options)


def one_copy_suffices(plan: Plan, problem: AutoProblem) -> bool:
    """Copy 0 alone times like the whole plan (:mod:`pipeweave.auto.copies`)."""
    cores = problem.shared_cores
    return (plan.width > 1 and plan.microbatches % plan.width == 0
            and (cores is None or cores >= plan.world_size)
            and copies_independent(plan.schedule, plan.chunks, plan.pipelines))


@dataclass(frozen=True)
class Timed:
    """A simulated candidate before the memory model is asked (:func:`with_memory`)."""

    candidate: Candidate
    plan: Plan
    iteration_time: float
    samples_per_second: float
    bubble_fraction: float
    one_copy: bool


def simulate_candidate(candidate: Candidate, profile: Profile, problem: AutoProblem) -> Timed:
    """Simulate ``candidate`` (partitioned, options filled)."""
    plan = candidate_plan(candidate, problem)
    costs = candidate_costs(candidate, plan, profile, problem)
    iterations = simulated_iterations(plan.schedule)
    one_copy = one_copy_suffices(plan, problem)
    result = time_plan(plan, costs, iterations, one_copy=one_copy)  # the timing alone
    samples = problem.batch * plan.pipelines
    return Timed(candidate=candidate, plan=plan, iteration_time=result.iteration_time,
                 samples_per_second=samples / result.iteration_time
                 if result.iteration_time > 0 else float("inf"),
                 bubble_fraction=result.bubble_fraction, one_copy=one_copy)


def with_memory(timed: Timed, problem: AutoProblem) -> Prediction:
    """``timed`` with the memory model's peak per rank."""
    memory = rank_memory(problem, timed.plan, one_copy=timed.one_copy)
    return Prediction(candidate=timed.candidate, plan=timed.plan,
                      iteration_time=timed.iteration_time,
                      samples_per_second=timed.samples_per_second,
                      bubble_fraction=timed.bubble_fraction, peak_memory_bytes=tuple(memory))


def predict(candidate: Candidate, profile: Profile, problem: AutoProblem) -> Prediction:
    """Simulate ``candidate`` (partitioned, options filled) and ask the memory model."""
    return with_memory(simulate_candidate(candidate, profile, problem), problem)
