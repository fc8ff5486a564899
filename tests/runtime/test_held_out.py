"""``Job.eval_every``: the weights each rank copies after a step are the whole model's after
that step, and the held-out loss is that model's loss on the held-out batches."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeweave.data.own_data import TokenData
from pipeweave.runtime import BuiltinModel, Job, OptimizerFactory, Plan, run_local
from pipeweave.runtime.checkpoint.snapshots import snapshot_steps
from pipeweave.runtime.observation.held_out import held_out_losses
from pipeweave.testing import merged_parameters

TEXT = "".join(f"{i}: every stage holds a contiguous range of blocks\n" for i in range(60))


def _job(tmp_path: Path, schedule: str, steps: int) -> Job:
    path = tmp_path / "corpus.txt"
    path.write_text(TEXT)
    model = BuiltinModel("gpt-tiny", dtype="float64",
                         overrides={"n_layers": 2, "d_model": 16, "n_heads": 2, "d_ff": 32,
                                    "seq_len": 8})
    return Job(plan=Plan.uniform(6, 3, schedule=schedule, microbatches=2), steps=steps,
               model=model, data=TokenData(str(path), batch_size=4, seq_len=8),
               optimizer=OptimizerFactory("adam", {"lr": 1e-2}), eval_every=2,
               return_parameters=True)


def test_snapshot_steps_are_every_nth_and_the_last() -> None:
    assert snapshot_steps(2, 5) == [2, 4, 5] and snapshot_steps(2, 6, after=3) == [4, 6]


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
def test_snapshots_are_the_weights_after_that_step(tmp_path: Path, schedule: str) -> None:
    results = run_local(_job(tmp_path, schedule, 3))
    steps = {step for r in results for step in r.snapshots}
    assert steps == {2, 3}
    after = {step: {n: t for r in results for n, t in r.snapshots.get(step, {}).items()}
             for step in steps}
    shorter = merged_parameters(run_local(_job(tmp_path, schedule, 2)))
    final = merged_parameters(results)
    for name, value in final.items():
        assert torch.equal(after[3][name], value) and torch.equal(after[2][name], shorter[name])


def test_held_out_loss_is_the_models_loss_on_the_held_out_batches(tmp_path: Path) -> None:
    job = _job(tmp_path, "1f1b", 2)
    results = run_local(job)
    final = merged_parameters(results)
    assert isinstance(job.data, TokenData)
    held = job.data.held_out()
    got = held_out_losses(job.model, held, {2: final}, batches=2)
    spec = job.model().materialized()
    network = spec.sequential()
    network.load_state_dict(final, strict=False)
    network.eval()
    stream = held()
    with torch.no_grad():
        want = sum(float(spec.loss_fn(network(x), y)) for x, y in (next(stream), next(stream)))
    assert got == {2: pytest.approx(want / 2, rel=1e-12)}
