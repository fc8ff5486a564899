"""Where checkpoints can be taken, which schedules allow them, and the options' rules."""

from __future__ import annotations

import dataclasses

import pytest

from pipeweave.ir import lower, parse_action
from pipeweave.runtime import run_local
from pipeweave.runtime import OptimizerFactory
from pipeweave.runtime.checkpoint.boundaries import (clean_boundaries, combine_hooks,
                                                    iteration_boundaries)
from pipeweave.runtime.checkpoint.options import CheckpointOptions
from pipeweave.runtime.launch.faults import injected_fault_hooks, parse_fault
from pipeweave.schedules import build_schedule

from checkpoint_jobs import mlp_job, with_checkpoints


def test_1f1b_boundaries_fall_after_each_iterations_update() -> None:
    # rank 0:  F0 SF0 F1 SF1 RB0 B0 RB1 B1 U@1 | F2 ... U@2 | F4 ... U@3 |   (9 actions each)
    schedule = lower(build_schedule("1f1b", stages=2, microbatches=2, iterations=3))
    for rank in (0, 1):
        cuts = iteration_boundaries(schedule, rank)
        assert cuts == [9, 18, 27]
        program = schedule.programs[rank]
        assert [str(program[c - 1]) for c in cuts] == [f"{rank}U@1", f"{rank}U@2", f"{rank}U@3"]
    assert [str(a) for a in schedule.programs[1][9:11]] == ["1RF2", "1F2@1"]


def test_boundaries_with_width_and_chunks() -> None:
    # width 2: the all-reduce and the update close the iteration:  F0 SF0 RB0 B0 AR@1 U@1 |
    wide = lower(build_schedule("1f1b", stages=2, microbatches=2, iterations=2, width=2))
    assert [iteration_boundaries(wide, r) for r in range(4)] == [[6, 12]] * 4
    assert str(wide.programs[2][5]) == "0U@1" and str(wide.programs[2][4]) == "0AR@1"
    # interleaved, two chunks per rank: both chunks' updates end the iteration (0U@1 2U@1 |)
    chunked = lower(build_schedule("interleaved-1f1b", stages=2, microbatches=4, iterations=2,
                                   chunks=2))
    for rank in (0, 1):
        cut = iteration_boundaries(chunked, rank)[0]
        assert [str(a) for a in chunked.programs[rank][cut - 2:cut]] == [f"{rank}U@1",
                                                                         f"{rank + 2}U@1"]
        assert parse_action(str(chunked.programs[rank][cut])).microbatch == 4


@pytest.mark.parametrize("schedule", ["pipedream", "2bw", "pipeoptim", "spectrain", "wpipe"])
def test_asynchronous_schedules_checkpoint_only_at_drains(schedule: str, tmp_path) -> None:
    # --checkpoint-every 2 drains every 2 steps; step 3 is no drain, so at=(3,) is refused
    chunks = 2 if schedule == "wpipe" else 1
    job = mlp_job(depth=2, schedule=schedule, steps=4, plan_fields={"chunks": chunks})
    if schedule == "spectrain":
        job = dataclasses.replace(job, optimizer=OptimizerFactory("sgd", {"lr": 0.01,
                                                                          "momentum": 0.9}))
    with pytest.raises(ValueError, match=rf"checkpoint after step 3 needs a drain there, but "
                                         rf"'{schedule}' drains every 2 steps"):
        run_local(with_checkpoints(job, directory=str(tmp_path), every=2, at=(3,)))
    with pytest.raises(ValueError, match=rf"step 3 needs a drain there, and '{schedule}' "
                                         rf"overlaps its steps and drains only at the end"):
        run_local(with_checkpoints(job, directory=str(tmp_path), at=(3,)))
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("kwargs", [{"lr": 0.01}, {"lr": 0.01, "momentum": 0.9, "nesterov": True}])
def test_pipeoptim_prediction_with_state_beyond_the_optimizers_is_refused(kwargs, tmp_path) -> None:
    job = dataclasses.replace(mlp_job(depth=2, schedule="pipeoptim", steps=4),
                              optimizer=OptimizerFactory("sgd", kwargs))
    with pytest.raises(ValueError, match="needs the last effective gradient or the previous "
                                         "weights, which a checkpoint does not hold"):
        run_local(with_checkpoints(job, directory=str(tmp_path), every=2))


def test_resume_where_the_run_does_not_drain_is_refused(tmp_path) -> None:
    job = mlp_job(depth=2, schedule="pipedream", steps=4)
    run_local(with_checkpoints(dataclasses.replace(job, steps=2), directory=str(tmp_path)))
    again = with_checkpoints(job, resume=str(tmp_path), directory=str(tmp_path), every=3)
    with pytest.raises(ValueError, match="the checkpoint is after step 2, but 'pipedream' drains "
                                         "every 3 steps here"):
        run_local(again)


def test_drained_program_has_boundaries_at_its_drains() -> None:
    # pipedream drain=2, K=5: rank 0 is clean after iterations 1, 3 and the end (4), not after
    # 0 or 2 (F2 runs before B1 there); the last stage never overlaps iterations
    schedule = lower(build_schedule("pipedream", stages=2, microbatches=2, iterations=5,
                                    options={"drain": 2}))
    assert sorted(clean_boundaries(schedule, 1)) == [0, 1, 2, 3, 4]
    for rank in (0, 1):
        cuts = clean_boundaries(schedule, rank)
        assert sorted(cuts) == ([1, 3, 4] if rank == 0 else [0, 1, 2, 3, 4])
        program = schedule.programs[rank]
        assert [parse_action(str(a)).microbatch for a in program[cuts[1]:]
                if a.microbatch is not None][0] == 4
        assert all(a.microbatch is None or a.microbatch < 4 for a in program[:cuts[1]])
    with pytest.raises(ValueError, match="no checkpoint boundary after step 1"):
        iteration_boundaries(schedule, 0)


def test_asynchronous_program_has_no_boundary() -> None:
    # pipedream rank 0:  F0 SF0 F1 SF1 RB0 B0 U@1 F2 ...  -- F1 (iteration 0) and U@2 overlap
    schedule = lower(build_schedule("pipedream", stages=2, microbatches=2, iterations=2))
    with pytest.raises(ValueError, match="no checkpoint boundar"):
        iteration_boundaries(schedule, 0)


def test_options_are_validated() -> None:
    with pytest.raises(ValueError, match="every=-1 is invalid"):
        CheckpointOptions(directory="x", every=-1)
    with pytest.raises(ValueError, match="at=\\[0\\] must name steps >= 1"):
        CheckpointOptions(directory="x", at=(0,))
    with pytest.raises(ValueError, match="pass --checkpoint-dir DIR with --resume auto"):
        CheckpointOptions(resume="auto")
    options = CheckpointOptions(directory="x", every=4, at=(3,))
    assert [k for k in range(1, 11) if options.writes_after(k, 10)] == [3, 4, 8, 10]
    assert [k for k in range(1, 11) if CheckpointOptions(directory="x").writes_after(k, 10)] == [10]
    assert not any(CheckpointOptions(resume="y").writes_after(k, 10) for k in range(1, 11))


def test_hooks_combine_in_order() -> None:
    calls: list[str] = []
    hooks = combine_hooks({3: lambda: calls.append("fence")}, {3: lambda: calls.append("write"),
                                                              5: lambda: calls.append("end")})
    hooks[3]()
    hooks[5]()
    assert calls == ["fence", "write", "end"]


def test_injected_fault_is_placed_after_the_first_forward_of_the_step() -> None:
    schedule = lower(build_schedule("1f1b", stages=2, microbatches=2, iterations=3))
    hooks = injected_fault_hooks(schedule, 1, {"PIPEWEAVE_INJECT_FAULT": "rank=1,step=2,once=/x"})
    (position,) = hooks
    assert str(schedule.programs[1][position]) == "1F2@1"  # step 2 = micro-batches 2, 3
    assert injected_fault_hooks(schedule, 0, {"PIPEWEAVE_INJECT_FAULT": "rank=1,step=2"}) == {}
    assert injected_fault_hooks(schedule, 1, {}) == {}
    with pytest.raises(ValueError, match="use rank=R,step=S"):
        parse_fault("rank=1,step=0")


def test_resume_past_the_end_is_rejected(tmp_path) -> None:
    job = with_checkpoints(mlp_job(depth=2, steps=2), directory=str(tmp_path))
    run_local(job)
    again = dataclasses.replace(job, checkpoint=CheckpointOptions(resume=str(tmp_path)))
    with pytest.raises(ValueError, match="is at step 2 and the run has 2 steps: nothing is left"):
        run_local(again)


@pytest.mark.parametrize("advance", [0, 1, "all"])
def test_avgpipe_boundaries_fall_after_every_pipelines_averaging(advance: object) -> None:
    # N=3: all pipelines update and average before any forward of the next iteration
    #   rank 0:  ... 0B3#2 0U@1 0AV@1 0U@1#1 0AV@1#1 0U@1#2 0AV@1#2 | 0F4@1 ...
    schedule = lower(build_schedule("avgpipe", stages=2, microbatches=4, iterations=3,
                                    pipelines=3, options={"advance": advance}))
    for rank in (0, 1):
        program = schedule.programs[rank]
        cuts = iteration_boundaries(schedule, rank)
        assert cuts[-1] == len(program)
        for k, cut in enumerate(cuts):
            assert [str(a) for a in program[cut - 6:cut]] == [
                f"{rank}{op}@{k + 1}{tag}" for tag in ("", "#1", "#2") for op in ("U", "AV")]
