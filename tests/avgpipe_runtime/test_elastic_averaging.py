"""AvgPipe's elastic averaging in the runtime equals its sequential oracle."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from pipeweave.oracle import run_elastic_oracle
from pipeweave.runtime import BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan, launch_local, run_local
from pipeweave.runtime.execution.elastic_averaging import ElasticAverager
from pipeweave.testing import merged_parameters, relative_error


def job(pipelines: int, *, schedule: str = "avgpipe", advance: object = 0, optimizer: str = "adam",
        steps: int = 3, semantics: dict | None = None) -> Job:
    model = BuiltinModel("gpt-tiny", dtype="float64",
                         overrides={"n_layers": 1, "d_model": 16, "n_heads": 2, "d_ff": 32, "seq_len": 8})
    options = {"advance": advance} if schedule == "avgpipe" else {}
    plan = Plan.uniform(4, 2, schedule=schedule, microbatches=4, pipelines=pipelines,
                        schedule_options=options, semantics=semantics or {})
    kwargs = {"lr": 3e-3} if optimizer == "adam" else {"lr": 0.05, "momentum": 0.9}
    return Job(plan=plan, steps=steps, model=model,
               data=BuiltinData("stdlib-bytes", batch_size=8, seq_len=8, dtype="float64"),
               optimizer=OptimizerFactory(optimizer, kwargs), return_parameters=True)


def oracle(j: Job):
    return run_elastic_oracle(spec=j.model(), pipelines=j.plan.pipelines, steps=j.steps,
                              data=j.data(), optimizer=j.optimizer,
                              alpha=j.plan.semantics.alpha,
                              order=j.plan.semantics.order)


def assert_matches(results, expected) -> None:
    params = merged_parameters(results)
    assert params.keys() == expected.parameters.keys()
    for name, value in expected.parameters.items():
        assert relative_error(params[name], value) <= 1e-10, name


def test_one_pipeline_is_exactly_the_plain_pipeline() -> None:
    plain = merged_parameters(run_local(job(1, schedule="1f1b")))
    averaged = merged_parameters(run_local(job(1)))
    assert all(torch.equal(plain[n], averaged[n]) for n in plain)


@pytest.mark.parametrize("pipelines", [2, 3])
@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_local_matches_oracle(pipelines: int, optimizer: str) -> None:
    j = job(pipelines, optimizer=optimizer)
    assert_matches(run_local(j), oracle(j))


@pytest.mark.parametrize("advance", [1, "all"])
def test_advance_forward_does_not_change_the_numbers(advance: object) -> None:
    j = job(2, advance=advance)
    assert_matches(run_local(j), oracle(j))


def test_other_order_and_alpha_match_their_oracle() -> None:
    j = job(2, semantics={"average_order": "update-then-dilute", "alpha": 0.3})
    assert_matches(run_local(j), oracle(j))
    default = merged_parameters(run_local(job(2)))
    assert any(not torch.equal(default[n], v) for n, v in merged_parameters(run_local(j)).items())


def test_reference_is_the_mean_of_the_parallel_models() -> None:
    torch.manual_seed(0)
    base = nn.Linear(3, 2)
    models = [nn.Linear(3, 2) for _ in range(3)]
    for m in models:
        m.load_state_dict(base.state_dict())
    averager = ElasticAverager(stage=0, pipelines=3, initial=base)
    for iteration in range(1, 4):
        for p, m in enumerate(models):
            averager.before_step(p, m)
            with torch.no_grad():
                for param in m.parameters():
                    param.add_(torch.randn_like(param))  # a local update
            averager.average(p, m, iteration)
        for name, ref in averager.reference_parameters().items():
            mean = sum(dict(m.named_parameters())[name].detach() for m in models) / 3
            torch.testing.assert_close(ref, mean, rtol=0, atol=1e-6)


def test_bad_alpha_and_order() -> None:
    with pytest.raises(ValueError, match="alpha=2.0"):
        ElasticAverager(stage=0, pipelines=2, initial=nn.Linear(1, 1), alpha=2.0)
    with pytest.raises(ValueError, match="order 'sideways'"):
        ElasticAverager(stage=0, pipelines=2, initial=nn.Linear(1, 1), order="sideways")


@pytest.mark.distributed
@pytest.mark.timeout(240)
@pytest.mark.parametrize("pipelines", [2, 3])
def test_distributed_matches_oracle_and_local(pipelines: int) -> None:
    j = job(pipelines)
    distributed = launch_local(j, deadline_s=200)
    assert_matches(distributed, oracle(j))
    local = merged_parameters(run_local(j))
    assert all(torch.equal(local[n], v) for n, v in merged_parameters(distributed).items())


def test_update_then_dilute_reference_takes_the_accumulated_update() -> None:
    """AvgPipe §3.2 Step 3 by hand: w_ref <- w_ref + (1/N) Σ δ_p; the reference is then not
    the mean of the diluted models, which moved by only (1 - α) mean δ."""
    models = [nn.Linear(2, 1, bias=False).double() for _ in range(2)]
    with torch.no_grad():
        for m in models:
            m.weight.copy_(torch.tensor([[1.0, 2.0]], dtype=torch.float64))
    averager = ElasticAverager(stage=0, pipelines=2, initial=models[0], alpha=0.5,
                               order="update-then-dilute")
    deltas = [torch.tensor([[0.4, -0.2]], dtype=torch.float64),
              torch.tensor([[-0.1, 0.6]], dtype=torch.float64)]
    for p, (m, delta) in enumerate(zip(models, deltas)):
        averager.before_step(p, m)
        with torch.no_grad():
            m.weight.add_(delta)
        averager.average(p, m, version=1)
    reference = averager.reference_parameters()["weight"]
    expected = torch.tensor([[1.0, 2.0]], dtype=torch.float64) + (deltas[0] + deltas[1]) / 2
    torch.testing.assert_close(reference, expected, rtol=0, atol=1e-15)
    mean = (models[0].weight + models[1].weight).detach() / 2
    torch.testing.assert_close(mean, torch.tensor([[1.0, 2.0]], dtype=torch.float64)
                               + 0.5 * (deltas[0] + deltas[1]) / 2, rtol=0, atol=1e-15)
