"""Ties across stages without transformers: a tiny torch model whose first and last blocks
share one weight, against the same model trained by plain torch (``runtime/execution/ties.py``;
the Hugging Face proofs are in tests/hf/test_hf_tied.py)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from pipeweave.models import ModelSpec
from pipeweave.runtime import Job, OptimizerFactory, Plan, run_local
from pipeweave.runtime.checkpoint.options import CheckpointOptions
from pipeweave.runtime.execution.ties import split_ties, tie_groups
from pipeweave.runtime.execution.parts import make_schedule
from pipeweave.testing import TiedHead, merged_parameters, relative_error

VOCAB, WIDTH, SEQ = 11, 6, 5


def tied_model() -> ModelSpec:
    torch.manual_seed(3)
    embed = nn.Embedding(VOCAB, WIDTH).double()
    middle = [nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()).double() for _ in range(2)]
    return ModelSpec.from_blocks(
        [embed, *middle, TiedHead(embed.weight)],
        lambda logits, targets: nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()),
        "tiny-tied")


def data() -> Iterator[tuple[Tensor, Tensor]]:
    generator = torch.Generator().manual_seed(5)
    while True:
        ids = torch.randint(0, VOCAB, (8, SEQ + 1), generator=generator)
        yield ids[:, :-1], ids[:, 1:]


def job(**plan: object) -> Job:
    return Job(plan=Plan.uniform(4, plan.pop("depth", 2), microbatches=4, **plan),  # type: ignore[arg-type]
               steps=3, model=tied_model, data=data,
               optimizer=OptimizerFactory("sgd", {"lr": 0.1, "momentum": 0.9}),
               return_parameters=True)


def plain_torch(steps: int) -> Tensor:
    model = tied_model()
    module = nn.Sequential(*model.blocks)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    for (ids, targets), _ in zip(data(), range(steps)):
        optimizer.zero_grad()
        model.loss_fn(module(ids), targets).backward()
        optimizer.step()
    return model.blocks[0].weight.detach()


def test_the_spec_lists_the_tie() -> None:
    assert tied_model().tied == (("0.weight", "3.weight"),)


@pytest.mark.parametrize("plan", [
    {"schedule": "1f1b"}, {"schedule": "gpipe", "depth": 4}, {"schedule": "zb-h1"},
    {"schedule": "1f1b", "width": 2}, {"schedule": "avgpipe"},
    {"schedule": "sliced-1f1b", "schedule_options": {"sliced": 2}},
    {"schedule": "v-half", "chunks": 2},
], ids=["1f1b", "gpipe-4", "zb-h1", "width-2", "avgpipe-1", "sliced", "v-half"])
def test_both_copies_equal_plain_torch(plan: dict[str, object]) -> None:
    run = job(**plan)
    got = merged_parameters(run_local(run))
    want = plain_torch(run.steps)
    assert relative_error(got["0.weight"], want) <= 1e-12
    assert relative_error(got["3.weight"], want) <= 1e-12


def test_a_one_stage_tie_needs_no_sum() -> None:
    run = job(depth=1)
    assert split_ties(run.model(), run.plan, make_schedule(run.plan, 1)) == ()


def test_groups_pair_replicas_and_a_v_sums_locally() -> None:
    run = job(schedule="1f1b", width=2)
    schedule = make_schedule(run.plan, 1)
    ties = split_ties(run.model(), run.plan, schedule)
    assert [t.stages for t in ties] == [(0, 1)]
    assert tie_groups(ties, schedule.layout) == [
        tuple(sorted((schedule.layout.stage_ranks[0][i], schedule.layout.stage_ranks[1][i])))
        for i in range(2)]
    v = dataclasses.replace(run, plan=Plan.uniform(4, 2, chunks=2, schedule="zbv",
                                                   microbatches=4))
    v_schedule = make_schedule(v.plan, 1)
    v_ties = split_ties(v.model(), v.plan, v_schedule)
    assert tie_groups(v_ties, v_schedule.layout) == []  # stages 0 and 3 both on rank 0


def test_unequal_replicas_are_refused() -> None:
    run = job(schedule="pipedream", replicas=(2, 1))
    with pytest.raises(ValueError, match=r"replicated \[1, 2\] times.*same number of replicas"):
        split_ties(run.model(), run.plan, make_schedule(run.plan, 1))


def test_parallel_pipelines_keep_their_copies_identical(tmp_path: Path) -> None:
    """AvgPipe, N = 2: each pipeline sums its own copies; averaging is linear, so every
    pipeline's two copies (and the reference's) stay equal bit for bit. The checkpoints
    compare every pipeline's copies' sha256 (and would refuse to complete otherwise)."""
    run = dataclasses.replace(job(schedule="avgpipe", pipelines=2),
                              checkpoint=CheckpointOptions(directory=str(tmp_path), every=1))
    results = run_local(run)
    manifests = list(tmp_path.rglob("MANIFEST.json"))
    assert len(manifests) == run.steps
    records = [json.loads(p.read_text()) for p in manifests[0].parent.glob("rank*.json")]
    checked = [name for r in records for pipeline in r["tied"] for name in pipeline]
    assert sorted(checked) == ["0.weight", "0.weight", "3.weight", "3.weight"]  # 2 pipelines
    got = merged_parameters(results)
    assert torch.equal(got["0.weight"], got["3.weight"])
    assert not torch.equal(got["0.weight"], tied_model().blocks[0].weight)


def test_post_validation_is_refused() -> None:
    """zb-h2's optimistic update checks the copies' gradients before any sum: refused."""
    run = job(schedule="zb-h2", schedule_options={"post_validation": True})
    with pytest.raises(ValueError, match=r"post_validation.*drop post_validation"):
        split_ties(run.model(), run.plan, make_schedule(run.plan, 1))
