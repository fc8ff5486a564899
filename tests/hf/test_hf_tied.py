"""Tied word embeddings split over stages stay one parameter (issue 17, item 3).

The embedding (first stage) and the LM head (last stage) each hold a copy; the holders sum the
copies' gradients before the update (``runtime/execution/ties.py``). Checked here against
plain torch and HF's own training, float64, every parameter within 1e-10:

* the summed gradient is the untied model's two gradients added (plain torch, no pipeweave);
* pipelined training equals HF's tied model trained without a pipeline, over a grid of
  families, tied/untied, sub-layer split, 2 and 4 ranks and schedules (single-process
  executor), and a few cells with real processes;
* a checkpoint stores the weight once and a resumed run equals an uninterrupted one;
* schedules that would show the copies different weight versions are refused.

**The asynchronous method at zero staleness.** No asynchronous schedule has zero staleness
over several updates on two or more stages: PipeDream and PipeOptim/SpecTrain keep
``P - 1 - stage`` updates in flight, WPipe's first group and PipeDream-2BW always lag one
version (the zero-staleness cases of ``tests/semantics/test_zero_staleness.py`` are P = 1, one
stage, where nothing can be split). PipeDream-2BW runs batch ``b`` at version ``max(0, b-1)``
on every stage, so its first update (one iteration, K = 1) has zero staleness: every
micro-batch at version 0, one step on the batch's mean gradient — plain training. That is the
cell used here (``2bw``, steps=1); :func:`test_2bw_keeps_the_tie_under_its_delay` then checks
2BW over several updates against HF trained with 2BW's own delay (the gradient taken at the
previous version, ``W(t+1) = W(t) - lr * grad f(W(t-1))``), since both copies see the same
version there too.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from pipeweave.runtime import Job, OptimizerFactory, Plan, launch_local, run_local  # noqa: E402
from pipeweave.runtime.checkpoint.options import CheckpointOptions  # noqa: E402
from pipeweave.testing import (assert_identical_runs, merged_parameters,  # noqa: E402
                               relative_error)

from hf_jobs import HFFactory, hf_job, hf_model, hf_reference, num_blocks  # noqa: E402

TOLERANCE = 1e-10
LAYERS = 3  # 5 blocks per layer split, 8 with sub-layers (enough for 4 ranks x 2 chunks)
HEAD = {"gpt2": "lm_head.weight", "llama": "lm_head.weight"}


def _job(family: str, *, tied: bool, sublayer: bool, depth: int, schedule: str,
         steps: int = 2, **plan: Any) -> Job:
    job = hf_job(family, sublayer=sublayer, tied=tied)
    blocks = num_blocks(sublayer, LAYERS)
    return dataclasses.replace(
        job, model=HFFactory(family, sublayer, tied, LAYERS), steps=steps,
        plan=Plan.uniform(blocks, depth, schedule=schedule, microbatches=4, **plan))


def _assert_equals_hf(results: Any, job: Job, family: str, *, tied: bool,
                      sublayer: bool) -> None:
    """Every parameter equals HF's; a tied weight's every copy equals HF's one weight."""
    got = merged_parameters(results)
    want = hf_reference(job, family, sublayer=sublayer, tied=tied, layers=LAYERS).parameters
    head = f"{job.plan.num_blocks - 1}.{HEAD[family]}"
    copies: dict[str, str] = {}
    if tied and len(job.plan.stages) > 1:  # the head's copy of the embedding, under its name
        copies = {head: "0." + ("wte.weight" if family == "gpt2" else "embed_tokens.weight")}
    assert set(got) == set(want) | set(copies), sorted(set(got) ^ set(want))
    errors = {n: relative_error(v, want[copies.get(n, n)]) for n, v in got.items()}
    worst = max(errors, key=errors.__getitem__)
    assert errors[worst] <= TOLERANCE, f"{worst}: relative error {errors[worst]:.3e}"


# -- the gradient of the shared weight is the sum of both uses' ------------------------------
@pytest.mark.timeout(300)
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_tied_gradient_is_the_sum_of_both_uses(family: str) -> None:
    """One SGD step (lr 1, no momentum) moves each copy by the gradient it applied; plain
    torch on an untied copy of the model gives the two uses' gradients separately."""
    job = dataclasses.replace(
        _job(family, tied=True, sublayer=True, depth=2, schedule="1f1b", steps=1),
        optimizer=OptimizerFactory("sgd", {"lr": 1.0}))
    tied = hf_model(family, tied=True, layers=LAYERS)
    initial = tied.get_input_embeddings().weight.detach().clone()
    untied = hf_model(family, tied=False, layers=LAYERS)
    untied.load_state_dict({k: v for k, v in tied.state_dict().items()}, strict=False)
    with torch.no_grad():
        untied.get_output_embeddings().weight.copy_(initial)
    ids, labels = next(iter(job.data()))
    untied(ids, labels=labels).loss.backward()
    embedding = untied.get_input_embeddings().weight.grad
    head = untied.get_output_embeddings().weight.grad
    assert embedding is not None and head is not None
    got = merged_parameters(run_local(job))
    names = [n for n in got if n.endswith(("wte.weight", "embed_tokens.weight", "lm_head.weight"))]
    assert len(names) == 2, names  # one copy on each of the two stages
    for name in names:
        applied = initial - got[name]
        assert relative_error(applied, embedding + head) <= TOLERANCE, name
        assert relative_error(applied, head) > 1e-3, "the embedding's use must count"
        assert relative_error(applied, embedding) > 1e-3, "the head's use must count"


# -- pipelined training equals HF's, over the grid ---------------------------------------------
SCHEDULES = {
    "gpipe": {"schedule": "gpipe"},
    "1f1b": {"schedule": "1f1b"},
    "interleaved": {"schedule": "interleaved-1f1b", "chunks": 2},
    "2bw-zero-staleness": {"schedule": "2bw", "steps": 1},
}


def _grid() -> list[Any]:
    cells = []
    for family in ("gpt2", "llama"):
        for tied in (True, False):
            for sublayer in (False, True):
                for depth in (2, 4):
                    for name in SCHEDULES:
                        if name == "interleaved" and depth == 4 and not sublayer:
                            continue  # 8 stages need 8 blocks: 3 layers split into sub-layers
                        cells.append(pytest.param(
                            family, tied, sublayer, depth, name,
                            id=f"{family}-{'tied' if tied else 'untied'}-"
                               f"{'sublayers' if sublayer else 'layers'}-{depth}ranks-{name}"))
    return cells


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("family", "tied", "sublayer", "depth", "name"), _grid())
def test_pipelined_equals_hf_training(family: str, tied: bool, sublayer: bool, depth: int,
                                      name: str) -> None:
    fields = dict(SCHEDULES[name])
    steps = int(fields.pop("steps", 2))
    job = _job(family, tied=tied, sublayer=sublayer, depth=depth, steps=steps, **fields)
    _assert_equals_hf(run_local(job), job, family, tied=tied, sublayer=sublayer)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("plan", [
    {"schedule": "zb-h1"},                    # split backward: the sum after the last W
    {"schedule": "zbv", "chunks": 2},         # V: embedding and head on rank 0, summed there
    {"schedule": "1f1b", "width": 2},         # replicas: pairwise sum, then the replica sum
    {"schedule": "interleaved-zb", "chunks": 2},
], ids=["zb-h1", "zbv", "data-parallel", "interleaved-zb"])
def test_more_schedules_keep_the_tie(plan: dict[str, Any]) -> None:
    job = _job("gpt2", tied=True, sublayer=True, depth=2, **plan)
    if plan.get("width"):
        job = dataclasses.replace(job, data=dataclasses.replace(job.data, batch_size=16))
    _assert_equals_hf(run_local(job), job, "gpt2", tied=True, sublayer=True)


@pytest.mark.timeout(300)
def test_2bw_keeps_the_tie_under_its_delay() -> None:
    """2BW over three updates against HF trained with 2BW's delay, written out here: update
    ``t`` applies the gradient of batch ``t`` taken at the weights before update ``t - 1``."""
    job = _job("gpt2", tied=True, sublayer=True, depth=2, schedule="2bw", steps=3)
    got = merged_parameters(run_local(job))
    model = hf_model("gpt2", tied=True, layers=LAYERS)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    previous = copy.deepcopy(model)
    for ids, labels in [batch for batch, _ in zip(job.data(), range(job.steps))]:
        at = copy.deepcopy(previous)  # the version the batch runs at
        previous = copy.deepcopy(model)
        at(ids, labels=labels).loss.backward()
        for param, stale in zip(model.parameters(), at.parameters()):
            param.grad = stale.grad
        optimizer.step()
    want = model.get_input_embeddings().weight.detach()
    head = f"{job.plan.num_blocks - 1}.lm_head.weight"
    for name in ("0.wte.weight", head):
        assert relative_error(got[name], want) <= TOLERANCE, name


# -- with real processes -----------------------------------------------------------------------
@pytest.mark.distributed
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("family", "depth", "plan"), [
    ("gpt2", 2, {"schedule": "1f1b"}),
    ("llama", 4, {"schedule": "interleaved-1f1b", "chunks": 2}),
], ids=["gpt2-2ranks-1f1b", "llama-4ranks-interleaved"])
def test_distributed_tied_equals_local_and_hf(family: str, depth: int,
                                              plan: dict[str, Any]) -> None:
    job = _job(family, tied=True, sublayer=True, depth=depth, **plan)
    distributed = launch_local(job, deadline_s=240)
    assert_identical_runs(distributed, run_local(job))
    _assert_equals_hf(distributed, job, family, tied=True, sublayer=True)


# -- checkpoints -------------------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_checkpoint_stores_the_tie_once_and_resumes_into_both_copies(tmp_path: Path) -> None:
    whole = _job("gpt2", tied=True, sublayer=False, depth=2, schedule="1f1b", steps=3)
    first = dataclasses.replace(whole, steps=2, checkpoint=CheckpointOptions(
        directory=str(tmp_path)))
    run_local(first)
    manifests = list(tmp_path.rglob("MANIFEST.json"))
    assert manifests
    for path in manifests:
        names = json.loads(path.read_text())["parameters"]
        assert "0.wte.weight" in names
        assert not any(n.endswith("lm_head.weight") for n in names)
    resumed = merged_parameters(run_local(dataclasses.replace(
        whole, checkpoint=CheckpointOptions(resume=str(tmp_path)))))
    expected = merged_parameters(run_local(whole))
    assert resumed.keys() == expected.keys()
    for name, value in expected.items():
        assert relative_error(resumed[name], value) <= 1e-12, name
    head = f"{whole.plan.num_blocks - 1}.lm_head.weight"
    assert torch.equal(resumed[head], resumed["0.wte.weight"])


def test_checkpoint_refuses_copies_that_differ(tmp_path: Path) -> None:
    from pipeweave.runtime.checkpoint.store import CheckpointError, finalize

    common = {"plan": {}, "schedule": "1f1b"}
    for rank, digest in enumerate(["aa", "bb"]):
        name = "0.wte.weight" if rank == 0 else "5.lm_head.weight"
        (tmp_path / f"rank{rank}.json").write_text(json.dumps({
            "rank": rank, "step": 1, "common": common, "parameters": {}, "file": f"r{rank}",
            "tied": [{name: {"of": "0.wte.weight", "sha256": digest}}]}))
    with pytest.raises(CheckpointError, match="copies 0.wte.weight and 5.lm_head.weight of "
                                              "tied parameter 0.wte.weight differ"):
        finalize(tmp_path, 2)


# -- where the copies would see different versions: refused -------------------------------------
@pytest.mark.parametrize(("plan", "reason"), [
    ({"schedule": "pipedream"}, r"schedule 'pipedream' runs the forward of micro-batch \d+ at "
                                r"version \d+ on stage 0, version \d+ on stage 1"),
    ({"schedule": "wpipe", "chunks": 2}, r"schedule 'wpipe' runs the \w+ of micro-batch"),
    ({"schedule": "pipeoptim"}, r"schedule 'pipeoptim' predicts weights"),
], ids=["pipedream", "wpipe", "pipeoptim"])
def test_schedules_that_show_the_copies_different_versions_are_refused(
        plan: dict[str, Any], reason: str) -> None:
    job = _job("gpt2", tied=True, sublayer=True, depth=2, **plan)
    with pytest.raises(ValueError, match=(
            r"model 'hf-gpt2' ties 0.wte.weight and 7.lm_head.weight .* on stages 0, \d+; "
            + reason + r".*use a synchronous schedule .* or 2bw, a plan with those blocks in "
            r"one stage, or build the model untied \(tie_word_embeddings=False\)")) as refused:
        run_local(job)
    assert "\n" not in str(refused.value)


@pytest.mark.timeout(300)
def test_clipping_counts_the_tied_weight_once() -> None:
    """``--clip-grad-norm`` with a tie split over stages: HF's tied model with torch's
    ``clip_grad_norm_`` (the shared weight's gradient counted once)."""
    job = dataclasses.replace(_job("gpt2", tied=True, sublayer=True, depth=2, schedule="1f1b"),
                              clip_grad_norm=0.05)
    got = merged_parameters(run_local(job))
    model = hf_model("gpt2", tied=True, layers=LAYERS)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    clipped = False
    for (ids, labels), _ in zip(job.data(), range(job.steps)):
        optimizer.zero_grad(set_to_none=True)
        model(ids, labels=labels).loss.backward()
        clipped |= float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)) > 0.05
        optimizer.step()
    assert clipped, "the norm must bite for this test to mean anything"
    want = model.get_input_embeddings().weight.detach()
    assert relative_error(got["0.wte.weight"], want) <= TOLERANCE
