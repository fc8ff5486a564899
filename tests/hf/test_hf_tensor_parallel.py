"""The Hugging Face Llama family split over ``tp`` processes inside each stage (docs/sharding.md)
trains what HF's own model trains with ``torch.optim.SGD`` (float64, every parameter within
1e-10); GPT-2's fused ``c_attn`` is refused in one line."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("transformers")

from pipeweave.runtime import launch_local  # noqa: E402
from pipeweave.runtime.launch.prepare import prepare  # noqa: E402

from hf_jobs import hf_job, hf_reference  # noqa: E402
from test_hf_equivalence import _assert_matches  # noqa: E402


def _split(job, **fields):  # type: ignore[no-untyped-def]
    return dataclasses.replace(job, plan=dataclasses.replace(job.plan, tp=2, **fields))


@pytest.mark.distributed
@pytest.mark.timeout(600)
@pytest.mark.parametrize("sublayer", [False, True], ids=["layers", "sublayers"])
def test_llama_pp2_tp2_equals_hf_training(sublayer: bool) -> None:
    job = _split(hf_job("llama", sublayer=sublayer, steps=2))
    results = launch_local(job, deadline_s=500)
    _assert_matches(results, hf_reference(job, "llama", sublayer=sublayer),
                    job.plan.microbatches)


def test_gpt2_family_refused() -> None:
    with pytest.raises(ValueError, match="GPT-2 family: its fused Conv1D c_attn"):
        prepare(_split(hf_job("gpt2", sublayer=True)))
