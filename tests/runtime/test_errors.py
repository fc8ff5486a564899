"""Bad input fails fast with a clear message; a failing rank never leaves the others hanging."""

from __future__ import annotations

import dataclasses
import multiprocessing

import pytest

from pipeweave.runtime.launch import processes
from pipeweave.runtime import BuiltinData, Job, Plan, RunFailed, launch_local, run_local

from runtime_jobs import RankFaultData, gpt_job, mismatched_model, mlp_job


def test_batch_not_divisible_by_microbatches() -> None:
    job = dataclasses.replace(mlp_job(depth=2, microbatches=4),
                              data=BuiltinData("digits", batch_size=10, dtype="float64"))
    with pytest.raises(ValueError, match="batch size 10 is not divisible by microbatches=4"):
        run_local(job)


def test_unknown_schedule() -> None:
    job = mlp_job(depth=2, schedule="zigzag")
    with pytest.raises(ValueError, match="unknown schedule 'zigzag'; choose one of"):
        run_local(job)


def test_too_few_microbatches_for_schedule() -> None:
    job = mlp_job(depth=2, schedule="2bw", microbatches=1)
    with pytest.raises(ValueError, match="needs microbatches >= 2"):
        launch_local(job)


def test_plan_for_another_model() -> None:
    job = dataclasses.replace(mlp_job(depth=2), plan=Plan.uniform(6, 2))
    with pytest.raises(ValueError, match="plan covers 6 blocks but model 'mlp' has 4"):
        run_local(job)


def test_shape_mismatch_between_stages_is_reported_before_launch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def no_process(*args: object, **kwargs: object) -> None:
        raise AssertionError("a rank was started before the check")

    monkeypatch.setattr(processes.mp, "start_processes", no_process)
    job = dataclasses.replace(mlp_job(depth=2), model=mismatched_model, plan=Plan.uniform(2, 2))
    with pytest.raises(ValueError, match=r"stage 1 \(blocks 1..1\) cannot run block 1 .* "
                                         r"stage boundary.*shape \(1, 32\)"):
        launch_local(job)
    assert not multiprocessing.active_children()


def test_nan_loss_names_the_step() -> None:
    job = gpt_job(depth=2, optimizer="sgd", steps=30)
    job = dataclasses.replace(job, optimizer=dataclasses.replace(job.optimizer, kwargs={"lr": 1e6}))
    with pytest.raises(FloatingPointError, match="loss became (nan|inf).*lower the learning rate"):
        run_local(job)


@pytest.mark.distributed
@pytest.mark.timeout(120)
@pytest.mark.parametrize("world", [2, 4])
def test_rank_that_raises_stops_everyone(world: int) -> None:
    # The peers' own timeout (600 s) is past the test's: only the launcher can stop them in time.
    job = dataclasses.replace(mlp_job(depth=world, steps=50), timeout_s=600.0,
                              data=RankFaultData(rank=world - 1, at=3, mode="raise"))
    with pytest.raises(RunFailed, match=f"rank {world - 1} failed: RuntimeError: injected failure"):
        launch_local(job)
    assert not multiprocessing.active_children()


@pytest.mark.distributed
@pytest.mark.timeout(120)
def test_hung_peer_times_out_with_its_name() -> None:
    job = dataclasses.replace(mlp_job(depth=2, steps=50), timeout_s=3.0,
                              data=RankFaultData(rank=0, at=2, mode="hang"))
    with pytest.raises(RunFailed, match=r"(?s)rank 1 failed: .*PeerTimeout.*from rank 0.*probably died"):
        launch_local(job)
    assert not multiprocessing.active_children()


def test_spectrain_with_adam_is_refused_naming_the_fix() -> None:
    job = mlp_job(depth=2, schedule="spectrain")  # mlp_job trains with Adam
    with pytest.raises(ValueError, match=r"SpecTrain predicts with the SGD momentum buffer.*got "
                                         r"Adam\. Use --optimizer sgd --momentum 0\.9, or the "
                                         r"pipeoptim schedule"):
        run_local(job)


def test_vertical_sync_on_a_schedule_without_weight_versions() -> None:
    job = mlp_job(depth=2, schedule="1f1b", plan_fields={"schedule_options": {"vertical_sync": True}})
    with pytest.raises(ValueError, match=r"schedule '1f1b' got unknown option\(s\) \['vertical_sync'\]"):
        run_local(job)
