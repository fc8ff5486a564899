"""Resume continues exactly: same losses and bit-identical parameters as a run never stopped,
under the same plan or another one (single-process executor; tests/checkpoint/
test_distributed.py does the same across processes)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from pipeweave.data import build_dataset
from pipeweave.ir import Op, parse_action
from pipeweave.runtime import Plan, run_local
from pipeweave.runtime.checkpoint.options import CheckpointOptions
from pipeweave.runtime.checkpoint.store import LATEST, complete_checkpoints
from pipeweave.testing import merged_parameters

from checkpoint_jobs import assert_same_run, dropout_gpt_job, gpt_job, mlp_job, with_checkpoints


def _resumed(job, folder: Path):  # type: ignore[no-untyped-def]
    return run_local(dataclasses.replace(job, checkpoint=CheckpointOptions(resume=str(folder))))


SYNC = [("gpipe", 1, {}), ("1f1b", 1, {}), ("interleaved-1f1b", 2, {}),
        ("sliced-1f1b", 1, {"schedule_options": {"sliced": 2}}),
        ("zb-h1", 1, {}), ("zb-h2", 1, {}), ("zbv", 2, {}), ("dualpipev", 2, {})]


@pytest.mark.parametrize(("schedule", "chunks", "fields"), SYNC, ids=[s[0] for s in SYNC])
def test_resume_after_2_and_4_of_6_steps_matches_the_uninterrupted_run(
        schedule: str, chunks: int, fields: dict, tmp_path: Path) -> None:
    job = gpt_job(depth=2, schedule=schedule, chunks=chunks, steps=6, optimizer="adam",
                  plan_fields=fields)
    straight = run_local(job)
    written = run_local(with_checkpoints(job, directory=str(tmp_path), every=2))
    # Taking checkpoints does not change the run.
    assert_same_run(written, straight, microbatches=4, steps=[1, 2, 3, 4, 5, 6])
    after2, after4, after6 = complete_checkpoints(tmp_path)
    assert (tmp_path / LATEST).read_text().strip() == after6.name
    # Resumed after step 2, steps 3..6 are recomputed; after step 4, steps 5..6.
    assert_same_run(_resumed(job, after2), straight, microbatches=4, steps=[3, 4, 5, 6])
    assert_same_run(_resumed(job, after4), straight, microbatches=4, steps=[5, 6])


def test_resume_restores_the_loss_history_and_the_data_position(tmp_path: Path) -> None:
    job = mlp_job(depth=2, steps=5)
    straight = run_local(job)
    run_local(with_checkpoints(dataclasses.replace(job, steps=3), directory=str(tmp_path)))
    resumed = _resumed(job, tmp_path)  # the directory: its `latest` (after step 3)
    assert_same_run(resumed, straight, microbatches=4, steps=[1, 2, 3, 4, 5])
    # The resumed run only computed micro-batches 12..19 (steps 4, 5); 0..11 were restored.
    last = resumed[-1]
    assert sorted(last.losses) == list(range(20))
    forwards = [parse_action(text) for _, text, _, _ in last.records]
    assert {a.microbatch for a in forwards if a.op is Op.FORWARD} == set(range(12, 20))


def plain_digits():  # type: ignore[no-untyped-def]
    """A stream without state_dict: the resumed run skips the batches it already trained on."""
    yield from build_dataset("digits", batch_size=16, dtype=torch.float64)


def test_resume_with_a_stream_that_cannot_seek(tmp_path: Path) -> None:
    job = dataclasses.replace(mlp_job(depth=2, steps=4), data=plain_digits)
    straight = run_local(job)
    run_local(with_checkpoints(job, directory=str(tmp_path), at=(1,), at_end=False))
    assert_same_run(_resumed(job, tmp_path), straight, microbatches=4, steps=[2, 3, 4])


PLANS = {
    "3 stages, gpipe": dict(stages=((0, 1), (1, 3), (3, 4)), schedule="gpipe"),
    "uneven split 1+3": dict(stages=((0, 1), (1, 4)), schedule="1f1b"),
    "2 ranks x 2 chunks, interleaved": dict(stages=((0, 1), (1, 2), (2, 3), (3, 4)),
                                            schedule="interleaved-1f1b", chunks=2),
    "1 stage": dict(stages=((0, 4),), schedule="1f1b"),
    "2 ranks x 2 chunks in a V, split backward": dict(stages=((0, 1), (1, 2), (2, 3), (3, 4)),
                                                      schedule="zbv", chunks=2),
}


@pytest.mark.parametrize("plan", PLANS.values(), ids=list(PLANS))
def test_resume_under_another_plan_gives_identical_parameters(plan: dict, tmp_path: Path) -> None:
    job = mlp_job(depth=2, steps=5)  # 2 stages (blocks 0-1, 2-3), 1f1b, Adam
    straight = run_local(job)
    run_local(with_checkpoints(dataclasses.replace(job, steps=2), directory=str(tmp_path)))
    other = dataclasses.replace(job, plan=Plan(num_blocks=4, microbatches=4, **plan))
    # Blocks and their Adam moments found their new stages: steps 3..5 are the same updates.
    assert_same_run(_resumed(other, tmp_path), straight, microbatches=4, steps=[3, 4, 5])


def test_resume_with_data_parallel_width_matches_to_rounding(tmp_path: Path) -> None:
    job = mlp_job(depth=2, steps=4)
    straight = run_local(job)
    run_local(with_checkpoints(dataclasses.replace(job, steps=2), directory=str(tmp_path)))
    wide = dataclasses.replace(job, plan=dataclasses.replace(job.plan, width=2))
    got, want = merged_parameters(_resumed(wide, tmp_path)), merged_parameters(straight)
    for name in want:  # replicas sum their gradients in another order: equal up to rounding
        torch.testing.assert_close(got[name], want[name], rtol=1e-12, atol=1e-14)


def test_replicas_write_each_block_once(tmp_path: Path) -> None:
    job = with_checkpoints(mlp_job(depth=2, steps=1, plan_fields={"width": 2}),
                           directory=str(tmp_path))
    run_local(job)
    (folder,) = complete_checkpoints(tmp_path)
    manifest = json.loads((folder / "MANIFEST.json").read_text())
    blocks = {s["rank"]: s["blocks"] for s in manifest["shards"]}
    assert blocks == {0: [0, 1], 1: [2, 3], 2: [], 3: []}  # ranks 2, 3 are replicas
    assert manifest["step"] == 1 and manifest["world_size"] == 4
    assert sorted(manifest["parameters"]) == ["0.0.bias", "0.0.weight", "1.0.bias", "1.0.weight",
                                              "2.0.bias", "2.0.weight", "3.bias", "3.weight"]
    assert manifest["parameters"]["3.weight"] == {"shape": [10, 128], "dtype": "float64",
                                                  "file": "rank1.pt"}
    assert manifest["optimizer"]["type"] == "Adam"
    assert manifest["data"] == {"batches_done": 1, "stream": {
        "dataset": "digits", "split": "train", "batch_size": 16, "seq_len": None, "seed": 0}}


def test_dropout_resumes_exactly_with_each_ranks_random_stream(tmp_path: Path) -> None:
    job = dropout_gpt_job(depth=2, steps=4)
    straight = run_local(job)
    run_local(with_checkpoints(job, directory=str(tmp_path), every=2))
    after2 = complete_checkpoints(tmp_path)[0]
    assert_same_run(_resumed(job, after2), straight, microbatches=4, steps=[3, 4])


def test_resume_warns_about_hyper_parameters_not_about_how_the_step_runs(
        tmp_path: Path, recwarn: pytest.WarningsRecorder) -> None:
    """Another device or mesh picks fused/foreach anew (fused on a GPU): no warning for that;
    another learning rate is warned about."""
    job = gpt_job(depth=2, steps=4, optimizer="adam")
    run_local(with_checkpoints(job, directory=str(tmp_path), every=2))
    after2 = complete_checkpoints(tmp_path)[0]
    for implementation, lr, warned in (("foreach", None, False), ("loop", None, False),
                                       ("auto", 0.5, True)):
        optimizer = dataclasses.replace(job.optimizer, implementation=implementation)
        if lr is not None:
            optimizer = dataclasses.replace(optimizer, kwargs={**optimizer.kwargs, "lr": lr})
        recwarn.clear()
        run_local(dataclasses.replace(job, optimizer=optimizer,
                                      checkpoint=CheckpointOptions(resume=str(after2))))
        said = [str(w.message) for w in recwarn if "resuming with optimizer settings" in
                str(w.message)]
        assert bool(said) == warned, (implementation, said)
        assert all("fused" not in text and "foreach" not in text for text in said)
