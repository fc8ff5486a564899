"""Global gradient-norm clipping across stages equals torch's clip_grad_norm_ on the whole model."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from pipeweave.runtime import launch_local, run_local  # noqa: E402
from pipeweave.runtime.launch.prepare import prepare  # noqa: E402
from pipeweave.testing import assert_identical_runs, merged_parameters, relative_error  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from runtime_jobs import gpt_job  # noqa: E402

MAX_NORM = 0.05  # below the model's gradient norms, so most updates are clipped


def clipped_reference(job):  # type: ignore[no-untyped-def]
    """Non-pipelined training with ``torch.nn.utils.clip_grad_norm_`` before every step."""
    torch.manual_seed(job.seed)
    spec = job.model().materialized()
    model = spec.sequential()
    optimizer = job.optimizer(model.parameters())
    data, norms = iter(job.data()), []
    for _ in range(job.steps):
        inputs, targets = next(data)
        optimizer.zero_grad(set_to_none=True)
        spec.loss_fn(model(inputs), targets).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), job.clip_grad_norm)))
        optimizer.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}, norms


@pytest.mark.parametrize("schedule, chunks", [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2),
                                             ("zb-h1", 1), ("zb-h2", 1),
                                             ("dualpipev", 2)])
def test_clipped_pipeline_equals_clipped_whole_model(schedule: str, chunks: int) -> None:
    job = dataclasses.replace(gpt_job(depth=2, schedule=schedule, chunks=chunks, steps=3,
                                      plan_fields={"width": 2} if schedule == "1f1b" else None),
                              clip_grad_norm=MAX_NORM)
    results = run_local(job)
    expected, norms = clipped_reference(job)
    got = merged_parameters(results)
    for name, value in expected.items():
        assert relative_error(got[name], value) <= 1e-10, name
    for result in results:  # every rank saw the same global norm, torch's own
        assert result.grad_norms == pytest.approx(norms, rel=1e-10)
    assert max(norms) > MAX_NORM  # the test clips
    unclipped = merged_parameters(run_local(dataclasses.replace(job, clip_grad_norm=None)))
    assert any(relative_error(unclipped[n], v) > 1e-6 for n, v in expected.items())


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), float("inf")])
def test_a_bad_max_norm_is_refused(value: float) -> None:
    with pytest.raises(ValueError, match="must be a finite number > 0"):
        prepare(dataclasses.replace(gpt_job(depth=2), clip_grad_norm=value))


def test_an_asynchronous_schedule_is_refused() -> None:
    job = dataclasses.replace(gpt_job(depth=2, schedule="pipedream"), clip_grad_norm=1.0)
    with pytest.raises(ValueError, match="'pipedream' is asynchronous"):
        prepare(job)


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_distributed_clipping_equals_local() -> None:
    job = dataclasses.replace(gpt_job(depth=2, schedule="1f1b", steps=3), clip_grad_norm=MAX_NORM)
    distributed = launch_local(job, deadline_s=200)
    local = run_local(job)
    assert_identical_runs(distributed, local)
    assert [r.grad_norms for r in distributed] == [r.grad_norms for r in local]
