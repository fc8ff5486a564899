"""Pipelined HF models equal the same HF model trained without a pipeline by its own forward
(``model(ids, labels=ids).loss``) and ``torch.optim.SGD``: every parameter, float64, 1e-10."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("transformers")

from pipeweave.runtime import Plan, launch_local, run_local  # noqa: E402
from pipeweave.testing import (assert_identical_runs, iteration_losses,  # noqa: E402
                               merged_parameters, relative_error)

from hf_jobs import HFReference, hf_job, hf_reference, num_blocks  # noqa: E402

HF_LOSS_TOLERANCE = 1e-6
"""HF computes its loss in float32 even for float64 logits (ForCausalLMLoss upcasts with
``.float()``): a sum of micro-batch means and the full-batch mean differ by float32 rounding.
Gradients do not: the float32 loss gradient of each token is the same number either way."""


def _assert_matches(results, reference: HFReference, microbatches: int) -> None:  # type: ignore[no-untyped-def]
    parameters = merged_parameters(results)
    assert parameters.keys() == reference.parameters.keys()
    errors = {n: relative_error(parameters[n], reference.parameters[n]) for n in parameters}
    worst = max(errors, key=errors.__getitem__)
    assert errors[worst] <= 1e-10, f"{worst}: relative error {errors[worst]:.3e}"
    losses = iteration_losses(results, microbatches)
    assert len(losses) == len(reference.losses)
    for step, (got, want) in enumerate(zip(losses, reference.losses)):
        assert abs(got - want) <= HF_LOSS_TOLERANCE * want, (step, got, want)


@pytest.mark.parametrize("sublayer", [False, True], ids=["layers", "sublayers"])
@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_pipelined_equals_hf_training(family: str, schedule: str, sublayer: bool) -> None:
    job = hf_job(family, sublayer=sublayer, schedule=schedule)
    _assert_matches(run_local(job), hf_reference(job, family, sublayer=sublayer),
                    job.plan.microbatches)


@pytest.mark.parametrize(("depth", "plan_fields"), [
    (2, {"schedule": "interleaved-1f1b", "chunks": 2}),
    (2, {"schedule": "zb-h1"}),
    (2, {"schedule": "1f1b", "recompute": (True, True)}),
    (4, {"schedule": "1f1b"}),
], ids=["interleaved", "zb-h1", "recompute", "4-ranks"])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_more_synchronous_plans_equal_hf_training(family: str, depth: int,
                                                  plan_fields: dict) -> None:  # type: ignore[type-arg]
    job = hf_job(family, sublayer=True)
    job = dataclasses.replace(job, plan=Plan.uniform(num_blocks(True), depth, microbatches=4,
                                                     **plan_fields))
    _assert_matches(run_local(job), hf_reference(job, family, sublayer=True), 4)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_first_loss_is_hfs_loss(family: str) -> None:
    """One micro-batch: the loss is the same float32 mean HF computes, bit for bit."""
    job = hf_job(family, sublayer=True, schedule="gpipe", microbatches=1, steps=1)
    losses = iteration_losses(run_local(job), 1)
    assert losses == hf_reference(job, family, sublayer=True).losses


def test_tied_gpt2_in_one_stage_sums_both_uses() -> None:
    """A tie inside one stage stays one parameter: the embedding and the head's gradients add
    up in it, as in HF's tied model."""
    job = hf_job("gpt2", sublayer=True, depth=1, tied=True)
    results = run_local(job)
    assert "0.wte.weight" in merged_parameters(results)
    assert not any(name.endswith("lm_head.weight") for name in merged_parameters(results))
    _assert_matches(results, hf_reference(job, "gpt2", sublayer=True, tied=True), 4)


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_distributed_llama_equals_local_and_hf() -> None:
    job = hf_job("llama", sublayer=True, schedule="1f1b")
    distributed = launch_local(job, deadline_s=240)
    assert_identical_runs(distributed, run_local(job))
    _assert_matches(distributed, hf_reference(job, "llama", sublayer=True), 4)


def test_tied_gpt2_in_one_stage_resumes_from_its_checkpoint(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The tied weight is stored once (its first block's name) and restored into both uses."""
    from pipeweave.runtime.checkpoint.options import CheckpointOptions

    whole = hf_job("gpt2", sublayer=False, depth=1, tied=True, steps=3)
    first = dataclasses.replace(whole, steps=2, checkpoint=CheckpointOptions(
        directory=str(tmp_path)))
    run_local(first)
    resumed = run_local(dataclasses.replace(whole, checkpoint=CheckpointOptions(
        resume=str(tmp_path))))
    expected = merged_parameters(run_local(whole))
    assert merged_parameters(resumed).keys() == expected.keys()
    for name, value in expected.items():
        assert relative_error(merged_parameters(resumed)[name], value) <= 1e-12, name
