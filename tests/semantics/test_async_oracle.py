"""Asynchronous weight semantics: the runtime equals a sequential oracle of each paper's rule."""

from __future__ import annotations

import sys
from pathlib import Path

from dataclasses import replace

import pytest
import torch

from pipeweave.oracle import run_oracle
from pipeweave.runtime import BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan, launch_local, run_local
from pipeweave.runtime.observation.summary import iteration_losses
from pipeweave.testing import merged_parameters, relative_error

CASES = {
    # method: (schedule, schedule options)
    "pipedream": ("pipedream", {}),
    "pipedream-vs": ("pipedream", {"vertical_sync": True}),
    "2bw": ("2bw", {}),
    "pipeoptim": ("pipeoptim", {}),
    "spectrain": ("spectrain", {}),
    "wpipe": ("wpipe", {}),
}


def make_job(method: str, depth: int, optimizer: str, *, steps: int = 4, microbatches: int = 4,
             semantics: dict | None = None) -> Job:
    schedule, options = CASES[method]
    chunks = 2 if method == "wpipe" else 1
    layers = max(2, depth * chunks)  # blocks = 2 * layers + 2 >= stages
    model = BuiltinModel("gpt-tiny", dtype="float64",
                         overrides={"n_layers": layers, "d_model": 16, "n_heads": 2, "d_ff": 32,
                                    "seq_len": 8})
    plan = Plan.uniform(2 * layers + 2, depth, chunks=chunks, schedule=schedule,
                        microbatches=microbatches, schedule_options=options,
                        semantics=semantics or {})
    kwargs = {"sgd": {"lr": 0.05, "momentum": 0.9}, "adam": {"lr": 3e-3},
              "plain-sgd": {"lr": 0.05},
              "adamw": {"lr": 3e-3, "weight_decay": 0.1},
              "nesterov": {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3},
              "rmsprop": {"lr": 1e-3}}[optimizer]
    name = "sgd" if optimizer in ("nesterov", "plain-sgd") else optimizer
    return Job(plan=plan, steps=steps, model=model,
               data=BuiltinData("stdlib-bytes", batch_size=2 * microbatches, seq_len=8, dtype="float64"),
               optimizer=OptimizerFactory(name, kwargs), return_parameters=True)


def oracle_for(method: str, job: Job):
    return run_oracle(method, spec=job.model(), stages=list(job.plan.stages),
                      microbatches=job.plan.microbatches, steps=job.steps, data=job.data(),
                      optimizer=job.optimizer, lookahead=job.plan.schedule_options.get("lookahead"),
                      backward=job.plan.semantics.backward_mode,
                      drain=job.plan.schedule_options.get("drain"))


def assert_equal_to_oracle(results, oracle, microbatches: int) -> None:
    params = merged_parameters(results)
    assert params.keys() == oracle.parameters.keys()
    for name, expected in oracle.parameters.items():
        assert relative_error(params[name], expected) <= 1e-10, name
    losses = iteration_losses(results, microbatches)
    assert losses == pytest.approx(oracle.losses, rel=1e-10)


@pytest.mark.parametrize("method", list(CASES))
@pytest.mark.parametrize("depth", [2, 3])
def test_local_runtime_matches_oracle(method: str, depth: int) -> None:
    optimizer = "sgd"
    job = make_job(method, depth, optimizer, steps=max(4, 3 * depth // 4 + 1))
    assert job.steps * job.plan.microbatches >= 3 * depth  # at least 3P updates for per-mb methods
    assert_equal_to_oracle(run_local(job), oracle_for(method, job), job.plan.microbatches)


def with_drain(job: Job, every: int) -> Job:
    options = {**job.plan.schedule_options, "drain": every}
    return replace(job, plan=replace(job.plan, schedule_options=options))


@pytest.mark.parametrize("method", list(CASES))
def test_drain_resets_staleness_in_runtime_and_oracle_alike(method: str) -> None:
    """drain=2 over 5 steps (segments 0-1, 2-3, 4): the runtime equals the oracle that starts
    every segment on fresh weights, and the drain really changed the run (the oracle without
    it differs)."""
    optimizer = "adam" if method == "pipeoptim" else "sgd"
    job = with_drain(make_job(method, 3, optimizer, steps=5, microbatches=4), 2)
    oracle = oracle_for(method, job)
    assert_equal_to_oracle(run_local(job), oracle, job.plan.microbatches)
    undrained = oracle_for(method, with_drain(job, 5))
    assert any(not torch.equal(undrained.parameters[n], v) for n, v in oracle.parameters.items())


@pytest.mark.parametrize("optimizer", ["adam", "adamw", "nesterov", "rmsprop"])
def test_pipeoptim_prediction_per_optimizer(optimizer: str) -> None:
    job = make_job("pipeoptim", 3, optimizer)
    assert_equal_to_oracle(run_local(job), oracle_for("pipeoptim", job), job.plan.microbatches)


@pytest.mark.parametrize("lookahead", [0, 2])
@pytest.mark.parametrize("backward", ["recompute", "graph"])
def test_pipeoptim_constant_lookahead_option(lookahead: int, backward: str) -> None:
    """lookahead=0: forwards on the weights they find, backwards on the current ones."""
    job = make_job("pipeoptim", 3, "adam", semantics={"backward": backward})
    job = type(job)(**{**job.__dict__, "plan": Plan(**{
        **job.plan.__dict__, "schedule_options": {"lookahead": lookahead}})})
    assert_equal_to_oracle(run_local(job), oracle_for("pipeoptim", job), job.plan.microbatches)


def test_pipeoptim_graph_backward_option_matches_its_oracle() -> None:
    graph_job = make_job("pipeoptim", 3, "adam", semantics={"backward": "graph"})
    graph = run_local(graph_job)
    assert_equal_to_oracle(graph, oracle_for("pipeoptim", graph_job), 4)
    recompute = merged_parameters(run_local(make_job("pipeoptim", 3, "adam")))
    assert any(not torch.equal(recompute[n], v) for n, v in merged_parameters(graph).items())


@pytest.mark.distributed
@pytest.mark.timeout(300)
@pytest.mark.parametrize("method", ["pipedream", "pipedream-vs", "2bw", "pipeoptim", "wpipe"])
@pytest.mark.parametrize("depth", [2, 4])
def test_distributed_runtime_matches_oracle(method: str, depth: int) -> None:
    optimizer = "adam" if method == "pipeoptim" else "sgd"
    steps = 3 if method in ("2bw", "wpipe") else 3
    job = make_job(method, depth, optimizer, steps=steps, microbatches=4)
    if method not in ("2bw", "wpipe"):
        assert job.steps * job.plan.microbatches >= 3 * depth
    results = launch_local(job, deadline_s=280)
    assert_equal_to_oracle(results, oracle_for(method, job), job.plan.microbatches)


def test_pipeoptim_with_plain_sgd_predicts_with_the_last_gradient() -> None:
    """Table I with u = 0: ΔW is the last gradient, so the look-ahead changes the run."""
    job = make_job("pipeoptim", 3, "plain-sgd")
    results = run_local(job)
    assert_equal_to_oracle(results, oracle_for("pipeoptim", job), job.plan.microbatches)
    no_lookahead = type(job)(**{**job.__dict__, "plan": Plan(**{
        **job.plan.__dict__, "schedule_options": {"lookahead": 0}})})
    other = merged_parameters(run_local(no_lookahead))
    assert any(not torch.equal(other[n], v) for n, v in merged_parameters(results).items())


def test_spectrain_with_nesterov_predicts_with_the_momentum_buffer() -> None:
    job = make_job("spectrain", 3, "nesterov")
    assert_equal_to_oracle(run_local(job), oracle_for("spectrain", job), job.plan.microbatches)


def test_pipeoptim_graph_backward_with_recomputation_keeps_the_predicted_weights() -> None:
    """backward="graph" + recompute: the backward recomputes on the forward's predicted
    weights (the graph oracle), not on the current ones (the default's)."""
    graph_job = make_job("pipeoptim", 3, "adam", semantics={"backward": "graph"})
    recomputing = type(graph_job)(**{**graph_job.__dict__, "plan": Plan(**{
        **graph_job.plan.__dict__, "recompute": (True,) * len(graph_job.plan.stages)})})
    results = run_local(recomputing)
    assert_equal_to_oracle(results, oracle_for("pipeoptim", graph_job), 4)
    default = merged_parameters(run_local(make_job("pipeoptim", 3, "adam")))
    assert any(not torch.equal(default[n], v) for n, v in merged_parameters(results).items())
