"""No tensor value is read on the host inside a forward or a backward (issue 25).

On a GPU, reading a value (``float(t)``, ``t.item()``, ``bool(t)``, ``t.tolist()``) waits for
every kernel queued before it: one read per micro-batch left the GPU idle while the host
queued the next forward (``float(loss)`` in the last stage's forward cost most of the 21 %
the runtime lost to a plain loop). The test counts such reads made while a stage computes,
on the CPU (the same code runs on both devices); today's reads are allowed between actions
(the loss log after an optimizer step, :mod:`pipeweave.runtime.execution.losses`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch

from pipeweave.runtime import BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan, run_local
from pipeweave.runtime.execution.stage import StageRuntime

READS = ("item", "tolist", "__float__", "__int__", "__bool__")
COMPUTE = ("forward", "backward", "backward_input", "backward_weight")
TINY = {"n_layers": 2, "d_model": 16, "n_heads": 2, "d_ff": 32, "seq_len": 8}


def reads_inside_compute(monkeypatch: pytest.MonkeyPatch, job: Job) -> list[str]:
    inside = [0]
    reads: list[str] = []

    def computing(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            inside[0] += 1
            try:
                return method(*args, **kwargs)
            finally:
                inside[0] -= 1
        return wrapper

    def reading(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if inside[0]:
                reads.append(name)
            return method(tensor, *args, **kwargs)
        return wrapper

    for name in COMPUTE:
        monkeypatch.setattr(StageRuntime, name, computing(getattr(StageRuntime, name)))
    for name in READS:
        monkeypatch.setattr(torch.Tensor, name, reading(name, getattr(torch.Tensor, name)))
    run_local(job)
    return reads


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1", "gpipe", "pipedream"])
def test_stages_read_no_value_while_computing(monkeypatch: pytest.MonkeyPatch,
                                               schedule: str) -> None:
    job = Job(plan=Plan.uniform(6, 2, schedule=schedule, microbatches=4), steps=3,
              model=BuiltinModel("gpt-tiny", overrides=TINY),
              data=BuiltinData("stdlib-bytes", batch_size=8, seq_len=8),
              optimizer=OptimizerFactory("adam", {"lr": 1e-3}), count_activations=True)
    assert reads_inside_compute(monkeypatch, job) == []


def test_the_counter_sees_a_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """The counter itself works: a loss read inside the forward is seen."""
    original = StageRuntime._loss

    def reading_loss(self: StageRuntime, *args: Any, **kwargs: Any) -> torch.Tensor:
        loss = original(self, *args, **kwargs)
        float(loss.detach())
        return loss

    monkeypatch.setattr(StageRuntime, "_loss", reading_loss)
    job = Job(plan=Plan.uniform(6, 2, schedule="1f1b", microbatches=2), steps=1,
              model=BuiltinModel("gpt-tiny", overrides=TINY),
              data=BuiltinData("stdlib-bytes", batch_size=4, seq_len=8),
              optimizer=OptimizerFactory("sgd", {"lr": 0.1}))
    assert reads_inside_compute(monkeypatch, job) == ["__float__", "__float__"]


def test_a_diverging_loss_still_stops_the_run() -> None:
    job = Job(plan=Plan.uniform(6, 2, schedule="1f1b", microbatches=2), steps=50,
              model=BuiltinModel("gpt-tiny", overrides=TINY),
              data=BuiltinData("stdlib-bytes", batch_size=4, seq_len=8),
              optimizer=OptimizerFactory("sgd", {"lr": 1e30}))
    with pytest.raises(FloatingPointError, match="loss became"):
        run_local(job)


def test_a_diverged_run_reports_its_losses_after_the_error() -> None:
    from pipeweave.runtime.execution.losses import LossLog

    log = LossLog(stage=1)
    for microbatch, value in enumerate([2.0, float("nan"), float("inf")]):
        log.add(microbatch, torch.tensor(value))
    with pytest.raises(FloatingPointError, match="micro-batch 1"):
        log.values(wait=False)
    values = log.values()  # the failure report reads the rest without a second error
    assert values[0] == 2.0 and sorted(values) == [0, 1, 2]
