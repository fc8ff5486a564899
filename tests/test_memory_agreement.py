"""One memory model (issue 27, item 1): ``train --memory-limit``, ``plan``, ``auto``, ``tune``
and the simulator report the same bytes for the same plan, for every registered schedule.

The plan is the ``mlp`` model (4 blocks) on 2 ranks with the schedule's default chunks and
4 micro-batches (AvgPipe: 2 parallel pipelines). The profile's parameter bytes are the blocks'
shapes and its optimizer bytes what ``torch.optim.Adam`` keeps after a step on a copy of each
block (as the profiler measures them); the activation sizes are arbitrary but distinct.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from pipeweave.auto.memory import rank_memory, static_memory
from pipeweave.auto.problem import AutoProblem
from pipeweave.avgpipe.simulated import SimulatedModel
from pipeweave.memory import held_activations, weight_versions
from pipeweave.models import build_model
from pipeweave.planner import Plan, PlanRequest, make_plan
from pipeweave.planner.evaluate import plan_costs
from pipeweave.planner.memory import (plan_analysis, plan_weight_copies, predicted_memory,
                                      predicted_state, stage_activation_bytes)
from pipeweave.profiler import BlockProfile, Profile
from pipeweave.runtime import OptimizerFactory
from pipeweave.runtime.observation.memory import estimate_state_bytes
from pipeweave.schedules import available_schedules, get_info
from pipeweave.sim import simulate

SPEC = build_model("mlp")
RANKS, MICROBATCHES = 2, 4


def _adam_state_bytes(block: torch.nn.Module) -> float:
    """What torch.optim.Adam keeps for ``block`` after one step (moments and step counters)."""
    block = copy.deepcopy(block)
    optimizer = torch.optim.Adam(block.parameters())
    for param in block.parameters():
        param.grad = torch.zeros_like(param)
    optimizer.step()
    return float(sum(v.numel() * v.element_size() for s in optimizer.state.values()
                     for v in s.values() if isinstance(v, torch.Tensor)))


def _profile() -> Profile:
    blocks = tuple(BlockProfile(
        f"b{i}", 1.0, 2.0, output_bytes=1000.0 * (i + 1), activation_bytes=3000.0 + 500 * i,
        parameter_bytes=float(sum(p.numel() * p.element_size() for p in block.parameters())),
        optimizer_bytes=_adam_state_bytes(block), weight_grad=1.0, input_grad=1.0,
        pending_bytes=200.0, recorded_bytes=100.0) for i, block in enumerate(SPEC.blocks))
    return Profile(blocks, model="mlp", source="synthetic", batch_size=1, input_bytes=800.0,
                   metadata={"optimizer": "adam"})


PROFILE = _profile()
NAMES = [info.name for info in available_schedules()]


def _plan(name: str) -> Plan:
    info = get_info(name)
    return Plan.uniform(len(SPEC.blocks), RANKS, chunks=info.default_chunks, schedule=name,
                        microbatches=MICROBATCHES, pipelines=2 if name == "avgpipe" else 1)


@pytest.mark.parametrize("name", NAMES)
def test_every_caller_reports_the_models_bytes(name: str) -> None:
    plan = _plan(name)
    ranks = predicted_memory(PROFILE, plan, batch_size=MICROBATCHES, optimizer="adam")
    totals = [r.total for r in ranks]
    state = predicted_state(PROFILE, plan, optimizer="adam")
    # train --memory-limit: the model's state, from the blocks' shapes and the optimizer
    train = estimate_state_bytes(SPEC, plan, OptimizerFactory("adam", {"lr": 1e-3}))
    assert train == [int(s.total) for s in state]
    for full, fixed in zip(ranks, state):
        assert (full.parameters, full.optimizer_state, full.weight_versions) == (
            fixed.parameters, fixed.optimizer_state, fixed.weight_versions)
        assert full.gradients <= fixed.gradients
    # auto: the search's prediction, and its static bound below it
    problem = AutoProblem(PROFILE, RANKS * plan.width, batch_size=MICROBATCHES, optimizer="adam")
    assert rank_memory(problem, plan) == totals
    assert all(b <= t for b, t in zip(static_memory(problem, plan), totals))
    # plan --memory-limit: the check passes at the model's peak and refuses just under it
    # (the registry makes straight plans: one chunk per rank)
    if plan.chunks == 1 and plan.pipelines == 1:
        request = PlanRequest(PROFILE, RANKS, microbatches=MICROBATCHES, schedule=name)
        made = make_plan(replace(request, memory_limit=max(totals)), "uniform")
        assert made.plan.stages == plan.stages
        with pytest.raises(ValueError, match=f"needs {max(totals):.6g} bytes on rank"):
            make_plan(replace(request, memory_limit=max(totals) * 0.999), "uniform")
    # tune (AvgPipe's simulated source): the model's peak, split for Equation 8
    if name == "avgpipe":
        tuned = SimulatedModel(profile_at=lambda size: PROFILE, bounds=plan.stages,
                               batch_size=MICROBATCHES)
        assert tuned.memory(PROFILE, MICROBATCHES, plan.pipelines) == pytest.approx(totals)
        assert tuned.measure(MICROBATCHES, plan.pipelines).memory_bytes == pytest.approx(
            max(totals))
    # the simulator: held activations and weight versions as the model counts them
    lowered = plan_analysis(plan).schedule
    kept = stage_activation_bytes(PROFILE, plan)
    graph = plan.semantics.backward == "graph"
    result = simulate(lowered, replace(plan_costs(PROFILE, plan.stages), activation_bytes=kept),
                      keep_predicted=graph)
    assert list(result.peak_activation_bytes) == held_activations(lowered, kept)[1]
    versions = weight_versions(lowered, keep_predicted=graph)
    assert list(result.weight_versions) == versions
    # the model's weight copies: the simulator's versions less the live one, plus one where
    # the runtime copies the live weights for a forward whose backward follows an update
    assert all(v - 1 <= c <= v for c, v in zip(plan_weight_copies(plan), versions))
