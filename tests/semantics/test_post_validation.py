"""zb-h2 with the optimizer post-validation (``post_validation=true``; Qi et al. 2024 §4):
stages step on the partial gradient check, run the next iteration's warm-up forwards, and
undo and redo the step when the complete check clips or finds a NaN. Whatever happens, the
result is the flushed schedule's: per parameter against zb-h2 with ``--clip-grad-norm`` (the
all-stage clipper, which waits for every stage before any update) and against torch on the
whole model (``clip_grad_norm_``; a step whose gradient is not finite skipped)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional

from pipeweave.data import build_dataset
from pipeweave.models.registry import ModelSpec
from pipeweave.runtime import Job, OptimizerFactory, Plan, launch_local, run_local
from pipeweave.runtime.launch.prepare import prepare
from pipeweave.runtime.checkpoint.options import CheckpointOptions
from pipeweave.runtime.observation.summary import iteration_losses
from pipeweave.testing import assert_identical_runs, merged_parameters, relative_error

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from runtime_jobs import gpt_job  # noqa: E402

MAX_NORM = 2.45
"""Between the first stage's own gradient norm and the global one at steps 1 and 2 (2.72,
2.49; step 3's is 2.41): there the first stage steps optimistically and must undo it."""


def zb_h2(depth: int, *, post: bool | None, clip: float | None, steps: int = 3) -> Job:
    fields = {} if post is None else {"schedule_options": {"post_validation": post}}
    job = gpt_job(depth=depth, schedule="zb-h2", steps=steps, optimizer="adam", plan_fields=fields)
    return dataclasses.replace(job, clip_grad_norm=clip)


def assert_same_parameters(got, want, tolerance: float = 0.0) -> None:  # type: ignore[no-untyped-def]
    a, b = merged_parameters(got), merged_parameters(want)
    assert a.keys() == b.keys() and a
    for name in b:
        assert relative_error(a[name], b[name]) <= tolerance, name


def reference(job: Job):  # type: ignore[no-untyped-def]
    """Torch on the whole model: clip_grad_norm_ before each step, a non-finite step skipped."""
    torch.manual_seed(job.seed)
    spec = job.model().materialized()
    model = spec.sequential()
    optimizer = job.optimizer(model.parameters())
    data = iter(job.data())
    for _ in range(job.steps):
        inputs, targets = next(data)
        optimizer.zero_grad(set_to_none=True)
        spec.loss_fn(model(inputs), targets).backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        if not all(bool(torch.isfinite(g).all()) for g in grads):
            continue
        if job.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), job.clip_grad_norm)
        optimizer.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("depth", [2, 4])
def test_without_clipping_it_is_plain_zb_h2(depth: int) -> None:
    checked = run_local(zb_h2(depth, post=True, clip=None))
    assert_same_parameters(checked, run_local(zb_h2(depth, post=None, clip=None)))
    assert all(r.redone_updates == [] for r in checked)
    assert len(checked[0].grad_norms) == 3  # the check ran (NaN flag and norm), changed nothing


@pytest.mark.parametrize("depth", [2, 4])
def test_a_clipped_step_is_undone_and_redone_as_the_flushed_schedule_does(depth: int) -> None:
    checked = run_local(zb_h2(depth, post=True, clip=MAX_NORM))
    flushed = run_local(zb_h2(depth, post=None, clip=MAX_NORM))
    # the first stage stepped on its partial state and had to undo steps 1 and 2; every
    # stage redid them clipped; step 3 (norm 2.41) stood
    assert checked[0].undone_updates == [1, 2]
    assert all(r.redone_updates == [1, 2] for r in checked)
    assert_same_parameters(checked, flushed)  # bit for bit
    assert checked[0].grad_norms == flushed[0].grad_norms
    expected = reference(zb_h2(depth, post=True, clip=MAX_NORM))
    got = merged_parameters(checked)
    for name, value in expected.items():
        assert relative_error(got[name], value) <= 1e-10, name
    # and the clipping mattered
    unclipped = merged_parameters(run_local(zb_h2(depth, post=True, clip=None)))
    assert any(relative_error(unclipped[n], v) > 1e-6 for n, v in expected.items())


def test_redone_forwards_draw_the_same_dropout() -> None:
    """With dropout, a redone forward draws the masks the flushed run drew (the random
    generators go back to where they were after the update)."""
    def dropout(post: bool | None) -> Job:
        job = zb_h2(2, post=post, clip=MAX_NORM)
        return dataclasses.replace(job, model=dataclasses.replace(
            job.model, overrides={**job.model.overrides, "dropout": 0.1}))  # type: ignore[attr-defined]

    checked = run_local(dropout(True))
    assert checked[0].undone_updates
    assert_same_parameters(checked, run_local(dropout(None)))


def test_the_check_before_the_update_gives_the_same_result() -> None:
    before = run_local(zb_h2(2, post=False, clip=MAX_NORM))
    assert_same_parameters(before, run_local(zb_h2(2, post=None, clip=MAX_NORM)))
    assert all(r.undone_updates == [] and r.redone_updates == [] for r in before)


# -- an injected NaN ----------------------------------------------------------------------------
POISONED_CLASS = 7
"""A micro-batch whose targets are all this class poisons the last block's weight gradient."""


class PoisonedLinear(nn.Linear):
    """A linear layer whose weight gradient turns NaN for the micro-batch the loss marks
    (its input gradient stays finite, so only the last stage sees the NaN)."""

    marked: list[bool] | None = None

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        mark = [False]
        PoisonedLinear.marked = mark
        weight = self.weight * 1.0
        if weight.requires_grad:
            weight.register_hook(lambda grad: grad * float("nan") if mark[0] else grad)
        return functional.linear(inputs, weight, self.bias)


def poison_aware_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    if PoisonedLinear.marked is not None and bool((target == POISONED_CLASS).all()):
        PoisonedLinear.marked[0] = True
    return functional.cross_entropy(output, target)


def poisoned_model() -> ModelSpec:
    torch.manual_seed(0)
    blocks = (nn.Linear(64, 32, dtype=torch.float64), nn.Tanh(),
              nn.Linear(32, 32, dtype=torch.float64), PoisonedLinear(32, 10, dtype=torch.float64))
    return ModelSpec("poisoned-mlp", blocks, poison_aware_loss, ("a", "tanh", "b", "head"))


def poisoned_data():  # type: ignore[no-untyped-def]
    """Digits, batch 1's targets all POISONED_CLASS (its update must be skipped)."""
    for index, (inputs, targets) in enumerate(build_dataset("digits", batch_size=16,
                                                            dtype=torch.float64)):
        yield inputs, (torch.full_like(targets, POISONED_CLASS) if index == 1 else targets)


def poisoned_job(post: bool | None) -> Job:
    fields = {} if post is None else {"post_validation": post}
    plan = Plan.uniform(4, 2, schedule="zb-h2", microbatches=4, schedule_options=fields)
    return Job(plan=plan, steps=3, model=poisoned_model, data=poisoned_data,
               optimizer=OptimizerFactory("adam", {"lr": 1e-2}), return_parameters=True)


def test_an_injected_nan_undoes_the_step_everywhere() -> None:
    checked = run_local(poisoned_job(post=True))
    # the first stage's own gradients were finite: it stepped, then undid step 2 (batch 1)
    assert checked[0].undone_updates == [2] and checked[1].undone_updates == []
    assert all(r.redone_updates == [2] for r in checked)
    assert checked[0].grad_norms[1] != checked[0].grad_norms[1]  # NaN
    expected = reference(poisoned_job(post=True))
    got = merged_parameters(checked)
    for name, value in expected.items():
        assert torch.isfinite(got[name]).all(), name
        assert relative_error(got[name], value) <= 1e-10, name


def test_checkpoints_resume_exactly_at_post_validation_drains(tmp_path: Path) -> None:
    """--checkpoint-every 2 checks every 2nd update before it (drain=2), so the checkpoint
    after step 2 holds final weights; steps 1-2 undo and redo (MAX_NORM), and the run resumed
    after step 2 equals the run never stopped (which post-validates every update) bit for bit."""
    job = zb_h2(2, post=True, clip=MAX_NORM, steps=4)
    straight = run_local(job)
    written = run_local(dataclasses.replace(
        job, checkpoint=CheckpointOptions(directory=str(tmp_path), every=2)))
    assert_same_parameters(written, straight)
    schedule = prepare(dataclasses.replace(job, checkpoint=CheckpointOptions(
        directory=str(tmp_path / "x"), every=2))).schedule
    assert schedule.options["drain"] == 2
    resumed = run_local(dataclasses.replace(job, checkpoint=CheckpointOptions(
        resume=str(tmp_path / sorted(p.name for p in tmp_path.glob("step-00000002-*"))[0]))))
    assert_same_parameters(resumed, straight)
    assert iteration_losses(resumed, 4) == iteration_losses(straight, 4)
    with pytest.raises(ValueError, match="checkpoint after step 3 needs a drain there"):
        prepare(dataclasses.replace(job, checkpoint=CheckpointOptions(
            directory=str(tmp_path / "y"), every=2, at=(3,))))


@pytest.mark.distributed
@pytest.mark.timeout(300)
@pytest.mark.parametrize("depth", [2, 4])
def test_distributed_undo_and_redo_equal_local(depth: int) -> None:
    job = zb_h2(depth, post=True, clip=MAX_NORM)
    distributed = launch_local(job, deadline_s=280)
    local = run_local(job)
    assert_identical_runs(distributed, local)
    assert [r.redone_updates for r in distributed] == [r.redone_updates for r in local]
    assert distributed[0].undone_updates == [1, 2]
    assert_same_parameters(distributed, run_local(zb_h2(depth, post=None, clip=MAX_NORM)))


def test_with_apc_the_check_state_travels_in_full_precision() -> None:
    """APC rounds activations and gradients to fp16 on the wire, never the check's norm: the
    clipping decisions and norms are those of the flushed run with APC."""
    checked = run_local(dataclasses.replace(zb_h2(2, post=True, clip=MAX_NORM), apc=True))
    flushed = run_local(dataclasses.replace(zb_h2(2, post=None, clip=MAX_NORM), apc=True))
    assert checked[0].grad_norms == flushed[0].grad_norms
    assert_same_parameters(checked, flushed)
