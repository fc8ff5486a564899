"""At zero staleness every schedule is plain training with ``torch.optim`` (issue 11's invariant).

Every registered schedule runs on one rank (P = 1) with each optimizer setting and is compared
per parameter (float64) with a hand-written loop: ``torch.optim`` stepping on the mean loss of
the samples one update sees. What one update sees, and how stale its gradient is, is written
here from the papers, not read from pipeweave:

* flushed schedules and AvgPipe (N = 1): one step per batch (M micro-batches), no staleness;
* PipeDream, PipeOptim, SpecTrain: one step per micro-batch; at P = 1 nothing is in flight;
* PipeDream-2BW: one step per batch on the gradient taken one version back (W(b-1), its
  delay term, present at any depth);
* WPipe: one step per batch, group G0 (the first chunk) one version back, G1 current.

A schedule registered later must be added to ``STALE_GROUP`` or ``PER_MICROBATCH`` here (the
test fails naming it otherwise).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.func import functional_call

from pipeweave.runtime import BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan, run_local
from pipeweave.schedules import available_schedules
from pipeweave.testing import merged_parameters, relative_error

M, STEPS = 2, 3
PER_MICROBATCH = {"pipedream", "pipeoptim", "spectrain"}
STALE_GROUP = {"2bw": "all", "wpipe": "first"}  # gradient taken at the previous version
CHUNKS = {"wpipe": 2, "interleaved-1f1b": 2, "gpipe-grouped": 2}

OPTIMIZERS = {
    "sgd": ("sgd", {"lr": 0.1}),
    "sgd-momentum": ("sgd", {"lr": 0.05, "momentum": 0.9, "dampening": 0.1}),
    "sgd-nesterov-wd": ("sgd", {"lr": 0.05, "momentum": 0.9, "nesterov": True,
                                "weight_decay": 1e-2}),
    "adam": ("adam", {"lr": 3e-3}),
    "adamw": ("adamw", {"lr": 3e-3, "weight_decay": 0.1}),
    # eps 1e-4: the attention key bias has an exact gradient of zero (softmax ignores it), and
    # RMSprop divides its rounding noise by the noise's own magnitude; with a tiny eps two
    # summation orders of the same zero then differ by more than 1e-12 after a few steps
    "rmsprop": ("rmsprop", {"lr": 1e-3, "weight_decay": 1e-2, "eps": 1e-4}),
}


def make_job(schedule: str, optimizer: str) -> Job:
    chunks = CHUNKS.get(schedule, 1)
    model = BuiltinModel("gpt-tiny", dtype="float64",
                         overrides={"n_layers": 2, "d_model": 16, "n_heads": 2, "d_ff": 32,
                                    "seq_len": 8})
    name, kwargs = OPTIMIZERS[optimizer]
    return Job(plan=Plan.uniform(6, 1, chunks=chunks, schedule=schedule, microbatches=M),
               steps=STEPS, model=model,
               data=BuiltinData("stdlib-bytes", batch_size=2 * M, seq_len=8, dtype="float64"),
               optimizer=OptimizerFactory(name, kwargs), return_parameters=True)


def torch_loop(job: Job, schedule: str) -> dict[str, torch.Tensor]:
    """Plain training, written out: mean loss over an update's samples, ``optimizer.step()``."""
    spec = job.model().materialized()
    model = spec.sequential()
    optimizer = job.optimizer(model.parameters())
    stale = STALE_GROUP.get(schedule)
    first_chunk = {f"{i}." for i in range(*job.plan.stages[0])}  # WPipe's G0 blocks
    previous = {n: p.detach().clone() for n, p in model.named_parameters()}
    data = iter(job.data())
    per_update = 1 if schedule in PER_MICROBATCH else M
    for _ in range(job.steps):
        inputs, targets = next(data)
        pairs = list(zip(inputs.chunk(M), targets.chunk(M)))
        for first in range(0, M, per_update):
            current = {n: p.detach().clone() for n, p in model.named_parameters()}
            at = {n: (previous[n] if stale == "all" or (stale and n[:2] in first_chunk) else p)
                  for n, p in model.named_parameters()}
            leaves = {n: t if stale is None else t.detach().requires_grad_(True)
                      for n, t in at.items()}
            optimizer.zero_grad(set_to_none=True)
            # gradient accumulation over the update's micro-batches: mean loss of its samples
            for x, y in pairs[first:first + per_update]:
                loss = spec.loss_fn(functional_call(model, leaves, (x,)), y) / per_update
                grads = torch.autograd.grad(loss, list(leaves.values()))
                for (name, param), grad in zip(model.named_parameters(), grads):
                    param.grad = grad if param.grad is None else param.grad + grad
            optimizer.step()
            previous = current
    return {name: p.detach() for name, p in model.named_parameters()}


def cases() -> list[tuple[str, str]]:
    return [(info.name, optimizer) for info in available_schedules() for optimizer in OPTIMIZERS]


@pytest.mark.parametrize(("schedule", "optimizer"), cases())
def test_one_rank_equals_plain_torch_optim(schedule: str, optimizer: str) -> None:
    info = {i.name: i for i in available_schedules()}[schedule]
    assert info.synchronous or schedule in PER_MICROBATCH | set(STALE_GROUP), (
        f"new asynchronous schedule {schedule!r}: write its zero-staleness rule in this test")
    job = make_job(schedule, optimizer)
    if schedule == "spectrain" and OPTIMIZERS[optimizer][1].get("momentum", 0) == 0:
        with pytest.raises(ValueError, match="SpecTrain"):
            run_local(job)
        return
    got = merged_parameters(run_local(job))
    want = torch_loop(job, schedule)
    assert got.keys() == want.keys()
    for name, expected in want.items():
        assert relative_error(got[name], expected) <= 1e-12, (name, relative_error(got[name], expected))
    initial = dict(copy.deepcopy(job.model().materialized().sequential()).named_parameters())
    assert any(not torch.equal(want[n], initial[n]) for n in want), "the loop must train"


def test_the_torch_loop_sees_the_learning_rate_per_update() -> None:
    """Guard on the guard: with one micro-batch per update, halving lr changes the result."""
    job = make_job("pipedream", "sgd")
    slow = Job(**{**job.__dict__, "optimizer": OptimizerFactory("sgd", {"lr": 0.05})})
    a, b = merged_parameters(run_local(job)), merged_parameters(run_local(slow))
    assert any(relative_error(a[n], b[n]) > 1e-6 for n in a)
    assert isinstance(nn.Module, type)
