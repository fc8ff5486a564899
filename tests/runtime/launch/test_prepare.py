"""prepare(job): every check once, before any rank starts; what the ranks receive."""

from __future__ import annotations

import dataclasses
import pickle
import sys
from pathlib import Path

import pytest
import torch

from pipeweave.ir import validate
from pipeweave.models import build_model
from pipeweave.runtime import Plan, launch_local, run_local
from pipeweave.runtime.checkpoint.options import CheckpointOptions
from pipeweave.runtime.checkpoint.store import CheckpointError
from pipeweave.runtime.launch.prepare import PreparedJob, prepare

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from runtime_jobs import mlp_job  # noqa: E402

BUILDS: list[str] = []


@dataclasses.dataclass(frozen=True)
class CountingModel:
    """The MLP; every call in this process is counted (ranks in other processes are not)."""

    def __call__(self):  # type: ignore[no-untyped-def]
        BUILDS.append("built")
        return build_model("mlp", dtype=torch.float64)


def test_prepared_job_is_immutable_picklable_and_holds_the_validated_schedule() -> None:
    ready = prepare(mlp_job(depth=2, steps=2))
    validate(ready.schedule)  # the lowered schedule of the whole run, proven
    assert ready.schedule.lowered and ready.schedule.num_ranks == 2
    assert ready.schedule.iterations == 2
    assert ready.session is None and ready.first_step == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        ready.first_step = 3  # type: ignore[misc]
    again = pickle.loads(pickle.dumps(ready))
    assert again.schedule == ready.schedule and again.job.plan == ready.job.plan


@pytest.mark.parametrize("bad, message", [
    (dict(plan=Plan.uniform(3, 2, schedule="1f1b", microbatches=4)), "plan covers 3 blocks"),
    (dict(plan=Plan.uniform(4, 2, schedule="2bw", microbatches=1)), "needs microbatches >= 2"),
    (dict(checkpoint=CheckpointOptions(directory="unused", every=1),
          plan=Plan.uniform(4, 2, schedule="pipedream", microbatches=4,
                            schedule_options={"drain": 2})), "needs a drain there"),
])
def test_a_bad_job_is_refused_by_prepare(bad: dict, message: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError, match=message):
        prepare(dataclasses.replace(mlp_job(depth=2), **bad))


def test_a_missing_checkpoint_is_refused_before_anything_runs(tmp_path: Path) -> None:
    job = dataclasses.replace(mlp_job(depth=2),
                              checkpoint=CheckpointOptions(resume=str(tmp_path / "none")))
    with pytest.raises(CheckpointError):
        prepare(job)


def test_run_local_builds_the_model_once() -> None:
    BUILDS.clear()
    run_local(dataclasses.replace(mlp_job(depth=2, steps=1), model=CountingModel()))
    assert BUILDS == ["built"]  # shared by prepare and the ranks (each deep-copies its blocks)


def test_a_prepared_job_runs_as_given() -> None:
    """The executors take the prepared job as it is: no second model build in this process."""
    job = dataclasses.replace(mlp_job(depth=2, steps=1), model=CountingModel())
    ready = prepare(job, spec=build_model("mlp", dtype=torch.float64))
    BUILDS.clear()
    local = run_local(ready)
    assert BUILDS == ["built"]  # the executor's own copy only
    reference = run_local(job)  # prepared inside, as a Job
    assert [r.losses for r in local] == [r.losses for r in reference] and local[1].losses
    for mine, theirs in zip(local, reference):
        assert mine.parameters.keys() == theirs.parameters.keys()
        assert all(torch.equal(mine.parameters[k], theirs.parameters[k]) for k in mine.parameters)


@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_launch_local_does_not_rebuild_a_prepared_job() -> None:
    job = dataclasses.replace(mlp_job(depth=2, steps=1), model=CountingModel())
    ready = prepare(job)
    BUILDS.clear()
    results = launch_local(ready)
    assert BUILDS == []  # ranks build theirs in their own processes; the parent built nothing
    assert [r.rank for r in results] == [0, 1] and results[1].losses
