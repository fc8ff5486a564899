"""A padding mask carried between stages with the hidden state (``pipeweave.hf.blocks(model,
padding=True)``), against HF's own forward with ``attention_mask`` (float64, 1e-10).

The batches are left-padded (:class:`hf_jobs.PaddedData`), so real tokens would attend to the
padding if the mask were lost: the guard test shows that HF without the mask trains to other
weights. Every micro-batch counts the same number of labelled tokens (pipeweave weights
micro-batch losses by rows, HF takes the token mean of the whole batch; docs/hf.md).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

import pipeweave.hf  # noqa: E402
from pipeweave.runtime import Job, Plan, launch_local, run_local  # noqa: E402
from pipeweave.testing import assert_identical_runs, merged_parameters, relative_error  # noqa: E402

from hf_jobs import (HFFactory, PaddedData, hf_job, hf_model, hf_reference,  # noqa: E402
                     num_blocks)

LENGTHS = (14, 9, 12, 11, 14, 9, 12, 11)
"""Tokens kept per sample; micro-batches of two samples all count 23 labelled tokens (a
left pad position predicts the first token, which counts)."""


def _job(family: str, *, depth: int = 2, schedule: str = "1f1b", sublayer: bool = True,
         tied: bool = True) -> Job:
    job = hf_job(family, sublayer=sublayer, tied=tied)
    return dataclasses.replace(
        job, model=HFFactory(family, sublayer, tied, padding=True),
        data=PaddedData(8, LENGTHS),
        plan=Plan.uniform(num_blocks(sublayer), depth, schedule=schedule, microbatches=4))


def _assert_equals_hf(results: Any, job: Job, family: str, *, sublayer: bool = True) -> None:
    got = merged_parameters(results)
    want = hf_reference(job, family, sublayer=sublayer, tied=True).parameters
    for name, value in want.items():
        assert relative_error(got[name], value) <= 1e-10, name


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_logits_equal_hfs_with_the_attention_mask(family: str) -> None:
    model = hf_model(family, tied=True)
    inputs, _ = next(iter(PaddedData(8, LENGTHS)()))
    spec = pipeweave.hf.blocks(model, sublayer=True, padding=True)
    with torch.no_grad():
        got = spec.sequential()(inputs)
        want = model(inputs[:, 0], attention_mask=inputs[:, 1]).logits
    assert torch.equal(got, want)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("depth", "schedule", "sublayer"), [
    (2, "1f1b", True), (2, "gpipe", False), (4, "1f1b", True),
    (2, "interleaved-1f1b", True),
], ids=["2ranks-1f1b", "2ranks-gpipe-layers", "4ranks-1f1b", "interleaved"])
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_padded_training_equals_hf(family: str, depth: int, schedule: str,
                                   sublayer: bool) -> None:
    job = _job(family, depth=depth, schedule=schedule, sublayer=sublayer)
    if schedule == "interleaved-1f1b":
        job = dataclasses.replace(job, plan=Plan.uniform(num_blocks(sublayer), depth, chunks=2,
                                                         schedule=schedule, microbatches=4))
    _assert_equals_hf(run_local(job), job, family, sublayer=sublayer)


@pytest.mark.timeout(300)
def test_the_mask_matters() -> None:
    """Guard: the same batches without the mask train HF's model to other weights."""
    job = _job("gpt2")
    masked = hf_reference(job, "gpt2", sublayer=True, tied=True).parameters
    unmasked = hf_reference(dataclasses.replace(job, data=_Unmasked(PaddedData(8, LENGTHS))),
                            "gpt2", sublayer=True, tied=True).parameters
    assert max(relative_error(unmasked[n], masked[n]) for n in masked) > 1e-3


@dataclasses.dataclass(frozen=True)
class _Unmasked:
    padded: PaddedData

    def __call__(self) -> Any:
        return ((inputs[:, 0], labels) for inputs, labels in self.padded())


def test_unpadded_ids_are_refused_with_the_fix() -> None:
    job = dataclasses.replace(_job("gpt2"), data=_Unmasked(PaddedData(8, LENGTHS)))
    with pytest.raises(ValueError, match=r"with padding=True the embedding block expects int64 "
                                         r"\[batch, 2, seq\].*torch.stack\(\[ids, mask\], 1\)"):
        run_local(job)


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_distributed_padded_equals_local_and_hf() -> None:
    job = _job("llama")
    distributed = launch_local(job, deadline_s=240)
    assert_identical_runs(distributed, run_local(job))
    _assert_equals_hf(distributed, job, "llama")
