"""Equivalence checks: pipelined training against a non-pipelined reference.

The one shared helper behind the tests that prove synchronous schedules exact (DESIGN.md:
"synchronous schedules give the same gradients as non-pipelined training"), also usable by
anyone checking their own model: train a deep copy of the model as one ``nn.Sequential`` on
the same batches with the same optimizer, then compare every parameter.
``iteration_losses`` and ``merged_parameters`` live in :mod:`pipeweave.runtime` (re-exported
here for the tests).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .devices import place
from .runtime.job import Job
from .runtime.observation.summary import iteration_losses
from .runtime.observation.results import RankResult, merged_parameters

__all__ = ["Reference", "reference_run", "iteration_losses", "merged_parameters",
           "assert_matches_reference", "assert_identical_runs", "relative_error", "TiedHead"]


class TiedHead(nn.Module):
    """An output layer that reuses an embedding's weight (``hidden @ weight.T``): the smallest
    model with a parameter tied across blocks, for tests of ties (GPT-2's ``wte``/``lm_head``)."""

    def __init__(self, weight: nn.Parameter) -> None:
        super().__init__()
        self.weight = weight

    def forward(self, hidden: Tensor) -> Tensor:
        out: Tensor = hidden @ self.weight.t()
        return out


@dataclass(frozen=True)
class Reference:
    losses: list[float]
    parameters: dict[str, Tensor]


def reference_run(job: Job) -> Reference:
    """Train the job's model without a pipeline: full batch, mean loss, one step per batch, on
    the job's device (``cuda``: where the single-process executor runs, so that the two use
    the same kernels); the parameters come back on the CPU, as a run's results do."""
    if job.plan.pipelines != 1:
        raise ValueError("the non-pipelined reference covers one pipeline; use pipelines=1")
    torch.manual_seed(job.seed)
    device = place(job.device, local_rank=0, local_ranks=1).device
    spec = job.model().materialized(device)  # the values every stage built alone has
    model = spec.sequential().to(device).train()  # as the runtime trains: whatever mode it came in
    optimizer = job.optimizer(model.parameters())
    data = iter(job.data())
    losses = []
    for _ in range(job.steps):
        inputs, targets = next(data)
        inputs, targets = inputs.to(device), targets.to(device)
        loss = spec.loss_fn(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    parameters = {name: p.detach().cpu().clone() for name, p in model.named_parameters()}
    return Reference(losses, parameters)


def assert_identical_runs(got: Sequence[RankResult], want: Sequence[RankResult]) -> None:
    """Two runs of one job agree exactly: every parameter bit for bit, every rank's losses
    (e.g. the distributed run against the single-process executor)."""
    got_params, want_params = merged_parameters(got), merged_parameters(want)
    assert got_params.keys() == want_params.keys()
    for name in want_params:
        assert torch.equal(got_params[name], want_params[name]), name
    assert [r.losses for r in got] == [r.losses for r in want]


def relative_error(actual: Tensor, expected: Tensor) -> float:
    """``||actual - expected|| / max(||expected||, tiny)``."""
    scale = max(float(expected.norm()), 1e-30)
    return float((actual - expected).norm()) / scale


def assert_matches_reference(results: Sequence[RankResult], reference: Reference, *,
                             microbatches: int, tolerance: float) -> None:
    """Every parameter and every iteration's loss within ``tolerance`` (relative)."""
    parameters = merged_parameters(results)
    missing = set(reference.parameters) - set(parameters)
    if missing:
        raise AssertionError(f"pipelined run returned no value for parameters {sorted(missing)}")
    worst = max(reference.parameters, key=lambda n: relative_error(parameters[n], reference.parameters[n]))
    error = relative_error(parameters[worst], reference.parameters[worst])
    if error > tolerance:
        raise AssertionError(f"parameter {worst} differs from the reference by {error:.3e} "
                             f"(relative) > {tolerance:.1e}")
    losses = iteration_losses(results, microbatches)
    if len(losses) != len(reference.losses):
        raise AssertionError(f"{len(losses)} iteration losses, reference has {len(reference.losses)}")
    for step, (got, want) in enumerate(zip(losses, reference.losses)):
        if abs(got - want) > tolerance * max(abs(want), 1e-30):
            raise AssertionError(f"loss at step {step}: {got!r} vs reference {want!r}")
