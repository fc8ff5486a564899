"""Resuming an asynchronous schedule's checkpoint under another plan (single-process executor).

At a drain a rank holds its parameters and optimizer state only, keyed by block, so any split
and any P load them exactly. What the steps after the resume compute depends on the schedule:

* ``2bw``: every stage runs one update behind (``W(t+1) = W(t) - lr grad f(W(t-1))``) whatever
  the split, and ``wpipe``: the first half of the stages (G0) one behind, the second half (G1)
  none — so with G0 on the same blocks the resumed run equals the uninterrupted one, bit for bit;
* ``pipedream``, ``pipeoptim``, ``spectrain``: stage ``s`` of ``P`` runs ``P - s - 1`` updates
  behind, so a block's staleness changes with its stage: the resumed run continues from the
  exact state, under the new plan's staleness (as if that plan had run since the drain).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from pipeweave.runtime import BuiltinModel, Plan, run_local
from pipeweave.runtime.checkpoint.options import CheckpointOptions
from pipeweave.runtime.checkpoint.store import complete_checkpoints
from pipeweave.testing import merged_parameters

from checkpoint_jobs import assert_same_run, iteration_losses, mlp_job, with_checkpoints


def job_for(schedule: str, blocks: int, depth: int, *, chunks: int = 1,
            split: list[tuple[int, int]] | None = None):  # type: ignore[no-untyped-def]
    job = mlp_job(depth=depth, schedule=schedule, steps=6)
    plan = (Plan(num_blocks=blocks, stages=tuple(split), schedule=schedule, microbatches=4)
            if split else Plan.uniform(blocks, depth, chunks=chunks, schedule=schedule,
                                       microbatches=4))
    return dataclasses.replace(job, plan=plan, model=BuiltinModel(
        "mlp", dtype="float64", overrides={"n_hidden_layers": blocks - 1}))


def resumed_under(job, other, folder: Path, every: int = 2):  # type: ignore[no-untyped-def]
    return run_local(dataclasses.replace(other, checkpoint=CheckpointOptions(
        resume=str(folder), directory=str(folder.parent.parent / "again"), every=every)))


@pytest.mark.parametrize(("schedule", "blocks", "chunks", "depths"), [
    ("2bw", 4, 1, (2, 4)), ("2bw", 4, 1, (2, 3)), ("wpipe", 8, 2, (2, 4)), ("wpipe", 8, 2, (4, 2)),
], ids=["2bw-P2to4", "2bw-P2to3", "wpipe-P2to4", "wpipe-P4to2"])
def test_2bw_and_wpipe_resume_under_another_p_exactly(schedule: str, blocks: int, chunks: int,
                                                      depths: tuple[int, int], tmp_path: Path) -> None:
    first, second = (job_for(schedule, blocks, d, chunks=chunks) for d in depths)
    written = run_local(with_checkpoints(first, directory=str(tmp_path / "a"), every=2))
    after2 = complete_checkpoints(tmp_path / "a")[0]
    resumed = resumed_under(first, second, after2)
    assert_same_run(resumed, written, microbatches=4, steps=[1, 2, 3, 4, 5, 6])


def test_2bw_resumes_under_an_uneven_split_exactly(tmp_path: Path) -> None:
    even = job_for("2bw", 4, 2)
    uneven = job_for("2bw", 4, 2, split=[(0, 1), (1, 4)])
    written = run_local(with_checkpoints(even, directory=str(tmp_path / "a"), every=2))
    resumed = resumed_under(even, uneven, complete_checkpoints(tmp_path / "a")[1])
    assert_same_run(resumed, written, microbatches=4, steps=[1, 2, 3, 4, 5, 6])


@pytest.mark.parametrize("schedule", ["pipedream", "pipeoptim"])
def test_stashing_and_prediction_resume_under_another_p_from_the_exact_state(
        schedule: str, tmp_path: Path) -> None:
    """P=2 -> P=4: the restored steps are the P=2 run's; the first micro-batch after the drain
    (8) runs on the checkpointed weights on every stage in both plans, so its loss is the same
    bit for bit; later ones follow P=4's staleness, so the run then departs from P=2's."""
    two, four = job_for(schedule, 4, 2), job_for(schedule, 4, 4)
    written = run_local(with_checkpoints(two, directory=str(tmp_path / "a"), every=2))
    resumed = resumed_under(two, four, complete_checkpoints(tmp_path / "a")[0])
    got, want = iteration_losses(resumed, 4), iteration_losses(written, 4)
    assert got[:2] == want[:2]
    assert resumed[-1].losses[8] == written[-1].losses[8]
    assert resumed[-1].losses[9] != written[-1].losses[9]
    a, b = merged_parameters(resumed), merged_parameters(written)
    assert a.keys() == b.keys() and any(not torch.equal(a[n], b[n]) for n in a)


@pytest.mark.parametrize(("before", "after"), [("1f1b", "pipedream"), ("pipedream", "1f1b"),
                                                ("2bw", "wpipe")])
def test_another_schedule_resumes_from_the_drained_state(before: str, after: str,
                                                         tmp_path: Path) -> None:
    """At a drain the state is parameters and optimizer state, as at a flush, so any schedule
    continues any other's checkpoint: micro-batch 8, the first after the checkpoint, runs on
    the checkpointed weights in both runs and has the same loss bit for bit."""
    chunks = 2 if after == "wpipe" else 1
    written = run_local(with_checkpoints(job_for(before, 4, 2), directory=str(tmp_path / "a"),
                                         every=2))
    resumed = resumed_under(None, job_for(after, 4, 2 // chunks, chunks=chunks),
                            complete_checkpoints(tmp_path / "a")[0])
    assert iteration_losses(resumed, 4)[:2] == iteration_losses(written, 4)[:2]
    assert resumed[-1].losses[8] == written[-1].losses[8]
