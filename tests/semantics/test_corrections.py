"""The stale-weight corrections (options warmup, nesterov, pipemare; docs/semantics.md).

Three kinds of proof per correction:

* an oracle row: a model of scalar blocks (``h = w * x``, loss ``out**2``) whose updates are
  derived by hand below, for a run with a delayed step; the sequential oracle and the runtime
  must both give those numbers (and the uncorrected run must not);
* zero delay: the corrected run equals ``torch.optim`` stepping on the whole model directly;
* the runtime equals the oracle on a real model, in one process and on real processes.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch import nn

from pipeweave.ir import lower, validate
from pipeweave.models import ModelSpec
from pipeweave.oracle import run_oracle
from pipeweave.runtime import (BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan,
                               launch_local, run_local)
from pipeweave.schedules import Shape, build_schedule
from pipeweave.schedules.corrections import steady_delays
from pipeweave.sim.costs import Costs
from pipeweave.sim.simulator import simulate
from pipeweave.testing import merged_parameters, relative_error

# -- the scalar model of the hand-derived rows ------------------------------------------------


class Scale(nn.Module):
    """``x * w``, ``w`` one scalar starting at 1."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(1, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.w


def squared(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((output - target) ** 2).mean()


def scalars(blocks: int) -> ModelSpec:
    return ModelSpec("scalars", tuple(Scale() for _ in range(blocks)), squared,
                     tuple(f"s{i}" for i in range(blocks)))


class Ones:
    """Batches of ``rows`` inputs 1.0 with target 0.0."""

    def __init__(self, rows: int, count: int) -> None:
        self.rows, self.count = rows, count

    def __call__(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(torch.ones(self.rows, 1, dtype=torch.float64),
                 torch.zeros(self.rows, 1, dtype=torch.float64))] * self.count


class Scalars:
    def __init__(self, blocks: int) -> None:
        self.blocks = blocks

    def __call__(self) -> ModelSpec:
        return scalars(self.blocks)


def scalar_job(depth: int, microbatches: int, steps: int, options: dict,
               optimizer: dict) -> Job:
    plan = Plan.uniform(depth, depth, schedule="pipedream", microbatches=microbatches,
                        schedule_options=options)
    return Job(plan=plan, steps=steps, model=Scalars(depth), data=Ones(microbatches, steps),
               optimizer=OptimizerFactory("sgd", optimizer), return_parameters=True)


def scalar_results(job: Job) -> tuple[list[float], list[float]]:
    """``(oracle's w per block, runtime's w per block)``."""
    options = job.plan.schedule_options
    oracle = run_oracle("pipedream", spec=job.model(), stages=list(job.plan.stages),
                        microbatches=job.plan.microbatches, steps=job.steps, data=job.data(),
                        optimizer=job.optimizer, warmup=options.get("warmup", 0),
                        nesterov=options.get("nesterov"), pipemare=options.get("pipemare"))
    blocks = len(job.plan.stages)
    runtime = merged_parameters(run_local(job))
    return ([float(oracle.parameters[f"{i}.w"]) for i in range(blocks)],
            [float(runtime[f"{i}.w"]) for i in range(blocks)])


def test_nesterov_oracle_row() -> None:
    """P = 2, M = 1, two updates, SGD lr 0.1, momentum u = 0.5, nesterov=0.9. Stage 0 has
    delay 1 (its second gradient is taken at a0), stage 1 delay 0; the deepest delay is 1, so
    u_0 = 0.5 + 1 * (0.9 - 0.5) / 2 = 0.7 and u_1 = 0.5. Nesterov step: v = u v + g,
    w -= lr (g + u v).

    j=0 at a=b=1: out 1, dL/dout 2, g_a = g_b = 2. a1 = 1 - 0.1 (2 + 0.7*2) = 0.66,
    b1 = 1 - 0.1 (2 + 0.5*2) = 0.7.
    j=1 at a0 = 1 (stale), b1 = 0.7: out 0.7, dL/dout 1.4, g_b = 1.4, g_a = 1.4*0.7 = 0.98.
    v_a = 0.7*2 + 0.98 = 2.38, a2 = 0.66 - 0.1 (0.98 + 0.7*2.38) = 0.3954;
    v_b = 0.5*2 + 1.4 = 2.4, b2 = 0.7 - 0.1 (1.4 + 0.5*2.4) = 0.44.
    """
    job = scalar_job(2, 1, 2, {"nesterov": 0.9}, {"lr": 0.1, "momentum": 0.5})
    oracle, runtime = scalar_results(job)
    assert oracle == pytest.approx([0.3954, 0.44], abs=1e-12)
    assert runtime == pytest.approx([0.3954, 0.44], abs=1e-12)
    plain, _ = scalar_results(scalar_job(2, 1, 2, {}, {"lr": 0.1, "momentum": 0.5}))
    assert plain != pytest.approx([0.3954, 0.44], abs=1e-6)


def test_pipemare_oracle_row() -> None:
    """P = 3, M = 1, two updates, plain SGD lr 0.1, pipemare=2. Delays 2, 1, 0; only stage 0
    (τ = 2 > 1) is rescaled: update 1 by 2 ** -(1 - 1/2) = 1/sqrt(2), update 2 by 2 ** 0 = 1.

    j=0 at a=b=c=1: out 1, dL/dout 2, every gradient 2. a1 = 1 - 0.1 * 2 / sqrt(2),
    b1 = c1 = 0.8.
    j=1 at a0 = 1, b0 = 1 (stale), c1 = 0.8: out 0.8, dL/dout 1.6, g_c = 1.6,
    g_b = g_a = 1.6 * 0.8 = 1.28. a2 = a1 - 0.128 = 0.872 - 0.1 sqrt(2), b2 = 0.672,
    c2 = 0.64.
    """
    expected = [0.872 - 0.1 * math.sqrt(2.0), 0.672, 0.64]
    job = scalar_job(3, 1, 2, {"pipemare": 2}, {"lr": 0.1})
    oracle, runtime = scalar_results(job)
    assert oracle == pytest.approx(expected, abs=1e-12)
    assert runtime == pytest.approx(expected, abs=1e-12)
    plain, _ = scalar_results(scalar_job(3, 1, 2, {}, {"lr": 0.1}))
    assert plain == pytest.approx([0.672, 0.672, 0.64], abs=1e-12)  # a2 = 1 - 0.2 - 0.128


def test_warmup_oracle_row() -> None:
    """P = 2, M = 2, one iteration, plain SGD lr 0.1, warmup=1: micro-batch 1 runs on the
    weights micro-batch 0's update made (without warmup stage 0 would use a0).

    j=0 at a=b=1: out 1, dL/dout 2, g = 2: a1 = b1 = 0.8.
    j=1 at a1 = b1 = 0.8: out 0.64, dL/dout 1.28, g_a = g_b = 1.28 * 0.8 = 1.024:
    a2 = b2 = 0.6976. (Without: j=1 at a0 = 1, b1: out 0.8, g_b = 1.6, g_a = 1.28:
    a2 = 0.672, b2 = 0.64.)
    """
    oracle, runtime = scalar_results(scalar_job(2, 2, 1, {"warmup": 1}, {"lr": 0.1}))
    assert oracle == pytest.approx([0.6976, 0.6976], abs=1e-12)
    assert runtime == pytest.approx([0.6976, 0.6976], abs=1e-12)
    plain, _ = scalar_results(scalar_job(2, 2, 1, {}, {"lr": 0.1}))
    assert plain == pytest.approx([0.672, 0.64], abs=1e-12)


# -- zero delay: torch.optim itself ------------------------------------------------------------

M = 2


def gpt_job(schedule: str, depth: int, options: dict, optimizer: str, kwargs: dict, *,
            steps: int = 3) -> Job:
    chunks = 2 if schedule == "wpipe" else 1
    layers = max(2, depth * chunks)
    model = BuiltinModel("gpt-tiny", dtype="float64",
                         overrides={"n_layers": layers, "d_model": 16, "n_heads": 2, "d_ff": 32,
                                    "seq_len": 8})
    plan = Plan.uniform(2 * layers + 2, depth, chunks=chunks, schedule=schedule,
                        microbatches=2 * M if schedule in ("2bw", "wpipe") else M,
                        schedule_options=options)
    rows = 2 * plan.microbatches
    return Job(plan=plan, steps=steps, model=model,
               data=BuiltinData("stdlib-bytes", batch_size=rows, seq_len=8, dtype="float64"),
               optimizer=OptimizerFactory(optimizer, kwargs), return_parameters=True)


def torch_loop(job: Job, optimizer: torch.optim.Optimizer, model: nn.Module,
               per_update: int) -> dict[str, torch.Tensor]:
    """Plain training: ``optimizer.step()`` on the mean loss of ``per_update`` micro-batches."""
    spec = job.model()
    microbatches = job.plan.microbatches
    data = iter(job.data())
    for _ in range(job.steps):
        inputs, targets = next(data)
        pairs = list(zip(inputs.chunk(microbatches), targets.chunk(microbatches)))
        for first in range(0, microbatches, per_update):
            optimizer.zero_grad()
            for x, y in pairs[first:first + per_update]:
                (spec.loss_fn(model(x), y) / per_update).backward()
            optimizer.step()
    return {n: p.detach() for n, p in model.named_parameters()}


def assert_matches_torch(job: Job, make: type, kwargs: dict, per_update: int) -> None:
    model = job.model().materialized().sequential()
    expected = torch_loop(job, make(model.parameters(), **kwargs), model, per_update)
    got = merged_parameters(run_local(job))
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert relative_error(got[name], value) <= 1e-12, name


def test_nesterov_at_zero_delay_is_torch_nesterov_sgd() -> None:
    """P = 1: the correction's momentum is the configured one, and the step torch's Nesterov."""
    kwargs = {"lr": 0.05, "momentum": 0.9}
    job = gpt_job("pipedream", 1, {"nesterov": 0.99}, "sgd", kwargs)
    assert_matches_torch(job, torch.optim.SGD, {**kwargs, "nesterov": True}, per_update=1)


def test_nesterov_at_zero_delay_with_nadam_is_torch_nadam() -> None:
    """NAdam (the paper's optimizer, a Nesterov step already): beta1 unchanged at P = 1."""
    kwargs = {"lr": 3e-3, "betas": (0.9, 0.999)}
    job = gpt_job("pipedream", 1, {"nesterov": 0.99}, "nadam", kwargs)
    assert_matches_torch(job, torch.optim.NAdam, kwargs, per_update=1)


def test_pipemare_at_zero_delay_is_torch_adam() -> None:
    job = gpt_job("pipedream", 1, {"pipemare": 2}, "adam", {"lr": 3e-3})
    assert_matches_torch(job, torch.optim.Adam, {"lr": 3e-3}, per_update=1)


@pytest.mark.parametrize("schedule", ["pipedream", "2bw"])
def test_warmup_over_the_whole_run_is_torch_sgd(schedule: str) -> None:
    """P = 2, every iteration in the warm-up: no delay at all, so plain SGD with momentum on
    one micro-batch (pipedream) or one batch (2bw) per update."""
    kwargs = {"lr": 0.05, "momentum": 0.9}
    job = gpt_job(schedule, 2, {"warmup": 3}, "sgd", kwargs, steps=3)
    per_update = job.plan.microbatches if schedule == "2bw" else 1
    assert_matches_torch(job, torch.optim.SGD, kwargs, per_update)


# -- the runtime equals the oracle -------------------------------------------------------------

CASES = {
    # name: (schedule, oracle method, depth, options, optimizer, kwargs)
    "pipedream-nesterov": ("pipedream", "pipedream", 3, {"nesterov": 0.99}, "sgd",
                           {"lr": 0.05, "momentum": 0.9}),
    "pipedream-nesterov-nadam": ("pipedream", "pipedream", 3, {"nesterov": 0.99}, "nadam",
                                 {"lr": 3e-3, "decoupled_weight_decay": True,
                                  "weight_decay": 0.1}),
    "pipedream-pipemare": ("pipedream", "pipedream", 3, {"pipemare": 4}, "adam", {"lr": 3e-3}),
    "pipedream-warmup": ("pipedream", "pipedream", 3, {"warmup": 1}, "sgd",
                         {"lr": 0.05, "momentum": 0.9}),
    "pipedream-vs-all": ("pipedream", "pipedream-vs", 3,
                         {"vertical_sync": True, "warmup": 1, "nesterov": 0.95, "pipemare": 3},
                         "sgd", {"lr": 0.05, "momentum": 0.9}),
    "2bw-nesterov-warmup": ("2bw", "2bw", 3, {"nesterov": 0.99, "warmup": 1}, "sgd",
                            {"lr": 0.05, "momentum": 0.9}),
    "wpipe-nesterov-warmup": ("wpipe", "wpipe", 2, {"nesterov": 0.99, "warmup": 1}, "sgd",
                              {"lr": 0.05, "momentum": 0.9}),
    "pipeoptim-warmup-drain": ("pipeoptim", "pipeoptim", 3, {"warmup": 2, "drain": 3}, "adam",
                               {"lr": 3e-3}),
}


def oracle_of(method: str, job: Job):
    options = job.plan.schedule_options
    return run_oracle(method, spec=job.model(), stages=list(job.plan.stages),
                      microbatches=job.plan.microbatches, steps=job.steps, data=job.data(),
                      optimizer=job.optimizer, drain=options.get("drain"),
                      warmup=options.get("warmup", 0), nesterov=options.get("nesterov"),
                      pipemare=options.get("pipemare"))


def assert_equal(results, oracle) -> None:
    params = merged_parameters(results)
    assert params.keys() == oracle.parameters.keys()
    for name, expected in oracle.parameters.items():
        assert relative_error(params[name], expected) <= 1e-10, name


@pytest.mark.parametrize("case", list(CASES))
def test_local_runtime_matches_oracle(case: str) -> None:
    schedule, method, depth, options, optimizer, kwargs = CASES[case]
    job = gpt_job(schedule, depth, options, optimizer, kwargs, steps=5)
    oracle = oracle_of(method, job)
    assert_equal(run_local(job), oracle)
    base = {k: v for k, v in options.items() if k == "vertical_sync"}
    plain = oracle_of(method, replace(job, plan=replace(job.plan, schedule_options=base)))
    assert any(not torch.equal(plain.parameters[n], v) for n, v in oracle.parameters.items())


@pytest.mark.distributed
@pytest.mark.timeout(300)
@pytest.mark.parametrize("schedule,depth,options", [
    ("pipedream", 2, {"warmup": 1, "nesterov": 0.99}),
    ("pipedream", 3, {"pipemare": 3}),
    ("2bw", 2, {"warmup": 1, "nesterov": 0.95}),
])
def test_distributed_runtime_matches_oracle(schedule: str, depth: int, options: dict) -> None:
    optimizer, kwargs = (("adam", {"lr": 3e-3}) if "nesterov" not in options
                         else ("sgd", {"lr": 0.05, "momentum": 0.9}))
    job = gpt_job(schedule, depth, options, optimizer, kwargs, steps=3)
    results = launch_local(job, deadline_s=280)
    assert_equal(results, oracle_of(schedule, job))
    assert_equal(run_local(job), oracle_of(schedule, job))


# -- refusals, one line each -------------------------------------------------------------------

@pytest.mark.parametrize("options,optimizer,match", [
    ({"nesterov": 0.99}, ("adam", {"lr": 1e-3}), "needs torch.optim.SGD with momentum"),
    ({"nesterov": 0.99}, ("sgd", {"lr": 1e-3}), "needs torch.optim.SGD with momentum"),
    ({"nesterov": 1.5}, ("sgd", {"lr": 1e-3, "momentum": 0.9}), "nesterov must be"),
    ({"pipemare": 0}, ("sgd", {"lr": 1e-3}), "pipemare must be"),
    ({"warmup": -1}, ("sgd", {"lr": 1e-3}), "warmup must be"),
    ({"pipemare_t2": True}, ("sgd", {"lr": 1e-3}), "stashes weights"),
])
def test_refused_in_one_line(options: dict, optimizer: tuple, match: str) -> None:
    job = gpt_job("pipedream", 2, options, *optimizer)
    with pytest.raises(ValueError, match=match) as error:
        run_local(job)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("schedule,option", [("2bw", "pipemare"), ("wpipe", "pipemare"),
                                             ("pipeoptim", "nesterov"), ("1f1b", "warmup")])
def test_not_declared_where_it_does_not_apply(schedule: str, option: str) -> None:
    job = gpt_job(schedule, 2, {option: 1 if option != "nesterov" else 0.9}, "sgd",
                  {"lr": 1e-3, "momentum": 0.9})
    with pytest.raises(ValueError, match=f"unknown option.*{option}"):
        run_local(job)


# -- warm-up as schedule data ------------------------------------------------------------------

def test_warmup_grid() -> None:
    """P = 2, M = 2, K = 2, warmup=1: iteration 0 one micro-batch at a time, then PipeDream."""
    schedule = build_schedule("pipedream", stages=2, microbatches=2, iterations=2,
                              options={"warmup": 1})
    assert [" ".join(str(a) for a in program) for program in schedule.programs] == [
        "0F0@0 0B0@0 0U@1 0F1@1 0B1@1 0U@2 0F2@2 0F3@2 0B2@2 0U@3 0B3@2 0U@4",
        "1F0@0 1B0@0 1U@1 1F1@1 1B1@1 1U@2 1F2@2 1B2@2 1U@3 1F3@3 1B3@3 1U@4",
    ]


@pytest.mark.parametrize("name,per_iteration", [("pipedream", 4), ("pipeoptim", 4), ("2bw", 1)])
def test_warmup_costs_one_fill_and_drain_per_update(name: str, per_iteration: int) -> None:
    """Each warm-up update runs alone through the pipeline: ``(P - 1)(t_F + t_B)`` more per
    update, ``M`` updates per iteration for the per-micro-batch schedules, one for 2bw."""
    costs = Costs(forward=1.0, backward=2.0)

    def makespan(options: dict) -> float:
        schedule = build_schedule(name, stages=4, microbatches=4, iterations=6, options=options)
        validate(schedule)
        return simulate(lower(schedule), costs).makespan

    extra = makespan({"warmup": 2}) - makespan({})
    assert extra == pytest.approx(2 * per_iteration * 3 * 3.0)


def test_warmup_with_unequal_replicas_is_refused() -> None:
    with pytest.raises(ValueError, match="warmup needs every stage to update after the same"):
        build_schedule("pipedream", stages=2, microbatches=4, iterations=2, replicas=(2, 1),
                       options={"warmup": 1})
    validate(build_schedule("pipedream", stages=2, microbatches=4, iterations=3, width=2,
                            options={"warmup": 1}))


def test_steady_delays_do_not_depend_on_the_run_length() -> None:
    shape = Shape(stages=4, microbatches=1, iterations=1, options={"warmup": 1})
    assert steady_delays("pipedream", shape) == {0: 3, 1: 2, 2: 1, 3: 0}
    assert steady_delays("2bw", replace(shape, microbatches=4)) == {0: 1, 1: 1, 2: 1, 3: 1}
    assert steady_delays("wpipe", Shape(stages=2, microbatches=2, chunks=2)) == {
        0: 1, 1: 1, 2: 0, 3: 0}


def test_nadam_state_in_the_memory_model_is_what_torch_keeps() -> None:
    """``--optimizer nadam`` (for ``nesterov``): two moments and two scalars per tensor."""
    from pipeweave.memory import optimizer_key
    from pipeweave.memory.optimizers import optimizer_state_bytes

    params = [nn.Parameter(torch.ones(5, 3)), nn.Parameter(torch.ones(7))]
    optimizer = OptimizerFactory("nadam", {"lr": 1e-3})(params)
    for param in params:
        param.grad = torch.ones_like(param)
    optimizer.step()
    kept = sum(t.numel() * t.element_size() for state in optimizer.state.values()
               for t in state.values())
    weights = sum(p.numel() * p.element_size() for p in params)
    assert optimizer_key("nadam", {}) == "nadam"
    assert optimizer_state_bytes("nadam", weights, tensors=len(params)) == kept
