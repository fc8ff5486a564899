"""One candidate, predicted: its plan, its simulator costs, its simulated time and memory.

The costs are :func:`pipeweave.planner.evaluate.plan_costs` of the profile scaled to the
candidate's micro-batch (:mod:`pipeweave.auto.scaling`) on the links its layout crosses
(:mod:`pipeweave.auto.links`), with two adjustments the planner does not make::

    recompute   backward[s] += forward[s]   (the backward first re-runs the forward; in a split
                input_grad[s] += forward[s]  backward the I does), and a stage keeps only its
                                             input per micro-batch: activation[s] = bytes
                                             entering s (pipeweave's recomputation is per stage,
                                             runtime/execution/stage.py)
    apc         transfer time / 2            (fp16 instead of fp32 on the wire, WPipe §A.3;
                                             the latency stays, the conversion is not priced)

Schedule options the search can fill from the costs are filled (:data:`OPTION_PROVIDERS`):
a schedule that takes ``costs`` (AutoPipe's Slicer, Algorithm 2) gets the stage costs.
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
from .memory import rank_memory
from .timing import time_plan
from .problem import AutoProblem, Candidate

__all__ = ["Prediction", "Timed", "candidate_plan", "candidate_costs", "predict",
           "simulate_candidate", "with_memory", "OPTION_PROVIDERS", "one_copy_suffices"]


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
                pipelines=candidate.pipelines,
                recompute=(True,) * stages if candidate.recompute else (),
                schedule_options=dict(candidate.options))


def candidate_costs(candidate: Candidate, plan: Plan, profile: Profile,
                    problem: AutoProblem) -> Costs:
    """Simulator costs of ``plan`` (module docstring); ``profile`` is already scaled."""
    layout = plan.layout()
    topology = problem.topology or default_topology(profile, problem.ranks)
    latency = profile.link.latency if profile.link is not None else 0.0
    network = layout_network(topology, layout, latency=latency,
                             shared_cores=problem.shared_cores)
    replicas = tuple(layout.replicas(s) for s in range(layout.num_stages))
    costs = plan_costs(profile, plan.stages, network,
                       replicas if any(r > 1 for r in replicas) else None)
    if candidate.recompute:
        costs = _recomputed(costs, plan, profile)
    if candidate.apc:
        table = costs.resolve(len(plan.stages))
        costs = replace(costs, comm=tuple(t / 2 for t in table.transfer) or 0.0)
    return costs


def _recomputed(costs: Costs, plan: Plan, profile: Profile) -> Costs:
    table = costs.resolve(len(plan.stages))
    entering = [profile.input_bytes if a == 0 else profile.blocks[a - 1].output_bytes
                for a, _ in plan.stages]
    return replace(
        costs,
        backward=tuple(b + f for b, f in zip(table.backward, table.forward)),
        input_grad=tuple(i + f for i, f in zip(table.input_grad, table.forward)),
        weight_grad=table.weight_grad,
        activation_bytes=tuple(entering),
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
