"""Counted memory: activation bytes held between forward and backward, and model state."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipeweave.runtime import BuiltinModel, OptimizerFactory, Plan
from pipeweave.runtime.job import BuiltinData, Job
from pipeweave.runtime.observation.memory import (ActivationMeter, check_memory_limit, estimate_state_bytes,
                                      state_bytes)
from pipeweave.runtime.execution.stage import StagePlace, StageRuntime
from pipeweave.runtime.execution.parts import build_rank, make_schedule


def stage() -> StageRuntime:
    torch.manual_seed(0)
    blocks = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 4))
    return StageRuntime(place=StagePlace(1, (0, 3)), blocks=blocks,
                        loss_fn=nn.functional.mse_loss)


def test_counts_saved_activations_once_and_never_parameters() -> None:
    s, meter = stage(), ActivationMeter()
    x = torch.randn(2, 4)
    with meter.forward((1, 0, 0, 0), s.module, x) as kept:
        out = s.forward((0, 0, 0), x)
        assert out is not None
        kept.append(out)
    # input (2x4), tanh's output (2x8, saved by tanh and by the second Linear: once), the
    # stage output (2x4); the first Linear's output is not kept; weights never count
    assert meter.held == (8 + 16 + 8) * 4
    y = torch.randn(2, 4)
    with meter.forward((1, 1, 0, 0), s.module, y) as kept:
        kept.append(s.forward((1, 0, 0), y))  # type: ignore[arg-type]
    assert meter.held == meter.peak == 2 * 32 * 4
    meter.release(1, 0, 0)
    assert meter.held == 32 * 4
    meter.start_window()
    assert meter.window_peak == 32 * 4 and meter.peak == 2 * 32 * 4
    meter.release(1, 1, 0)
    assert meter.held == 0


@pytest.mark.parametrize("optimizer,moments", [("adam", 2), ("sgd", 0)])
def test_estimate_before_the_run_equals_the_count_after_a_step(optimizer: str, moments: int) -> None:
    model = BuiltinModel("gpt-tiny", overrides={"n_layers": 1, "d_model": 16, "n_heads": 2,
                                                "d_ff": 32, "seq_len": 8})
    spec = model()
    plan = Plan.uniform(4, 2, schedule="avgpipe", microbatches=2, pipelines=3)
    factory = OptimizerFactory(optimizer, {"lr": 0.1, **({"momentum": 0.0} if optimizer == "sgd" else {})})
    job = Job(plan=plan, steps=1, model=model, data=BuiltinData("stdlib-bytes", batch_size=2, seq_len=8),
              optimizer=factory)
    schedule = make_schedule(plan, 1)
    estimate = estimate_state_bytes(spec, plan, factory)
    for rank in range(2):
        parts = build_rank(job, rank, schedule, torch.device("cpu"), spec=spec)
        for pipeline in parts.pipelines:
            for stage_id, runtime in pipeline.stages.items():
                for p in runtime.module.parameters():
                    p.grad = torch.zeros_like(p)
                pipeline.optimizers[stage_id].step()
        params = sum(p.numel() * 4 for r in parts.stages.values() for p in r.module.parameters())
        assert state_bytes(parts) == estimate[rank]
        # N x (parameters + gradients + moments) + the reference; scalar "step" tensors aside
        assert 0 <= estimate[rank] - (3 * (2 + moments) + 1) * params < 1000
    with pytest.raises(ValueError, match=r"--memory-limit 1000 B is below what rank \d needs"):
        check_memory_limit(1000, estimate, plan)
    check_memory_limit(max(estimate) + 1, estimate, plan)
