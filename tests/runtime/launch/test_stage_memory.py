"""Each rank allocates its own stage, the launcher nearly nothing (issue 26, item 1): a model
of more than 400 MB of float32 weights on 4 ranks, measured at the allocator; and a user's
factory that builds on the meta device trains as its reference does."""

from __future__ import annotations

import pytest
import torch

from pipeweave.models import ModelSpec
from pipeweave.runtime import (BuiltinData, BuiltinModel, Job, OptimizerFactory, Plan, launch_local,
                               run_local)
from pipeweave.runtime.launch.prepare import prepare
from pipeweave.runtime.observation.allocations import AllocationTracker
from pipeweave.testing import assert_matches_reference, reference_run

MB = 2 ** 20
BIG = {"d_model": 1024, "d_ff": 4096, "n_heads": 8, "n_layers": 8, "seq_len": 8,
       "sublayer": False}  # 10 blocks; 8 layers of 12.6 M parameters: 403 MB of float32


def _job() -> Job:
    model = BuiltinModel("gpt-tiny", overrides=BIG)
    return Job(plan=Plan.uniform(10, 4, schedule="gpipe", microbatches=2), steps=1, model=model,
               data=BuiltinData("stdlib-bytes", batch_size=2, seq_len=8),
               optimizer=OptimizerFactory("sgd", {"lr": 0.01}), track_allocations=True,
               record_timeline=False, timeout_s=240.0)


def _stage_bytes(job: Job) -> list[int]:
    spec = job.model()  # on the meta device: sizes without storage
    return [sum(p.numel() * p.element_size() for block in spec.blocks[start:end]
                for p in block.parameters()) for start, end in job.plan.stages]


def test_the_launcher_validates_the_big_model_from_shapes() -> None:
    job = _job()
    assert sum(_stage_bytes(job)) > 400e6
    with AllocationTracker(torch.device("cpu")) as tracker:
        prepare(job)
    assert tracker.peak < 50 * MB, tracker.peak


@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_each_rank_allocates_its_stage_not_the_model() -> None:
    job = _job()
    stages = _stage_bytes(job)
    results = sorted(launch_local(job, deadline_s=540.0), key=lambda r: r.rank)
    peaks = [r.peak_allocated_bytes for r in results]
    for stage, peak in zip(stages, peaks):
        # parameters and gradients (SGD keeps no state), a few MB of activations; never the
        # model's 400 MB
        assert 2 * stage <= peak < 3 * stage, (stages, peaks)


def meta_mlp() -> ModelSpec:
    """A user's factory: its blocks built on the meta device, torch's own initialisation."""
    with torch.device("meta"):
        blocks = [torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU()),
                  torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Tanh()),
                  torch.nn.Linear(32, 10)]
    return ModelSpec.from_blocks(blocks, torch.nn.functional.cross_entropy, seed=3)


def test_a_users_meta_factory_trains_as_its_reference() -> None:
    job = Job(plan=Plan.uniform(3, 2, schedule="1f1b", microbatches=2), steps=3, model=meta_mlp,
              data=BuiltinData("digits", batch_size=8),
              optimizer=OptimizerFactory("sgd", {"lr": 0.1}), return_parameters=True)
    results = run_local(job)
    reference = reference_run(job)
    assert_matches_reference(results, reference, microbatches=2, tolerance=1e-6)
    initial = meta_mlp().materialized()
    assert not torch.equal(initial.blocks[0][0].weight, reference.parameters["0.0.weight"])
