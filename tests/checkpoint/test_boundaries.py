"""Where checkpoints can be taken, which schedules allow them, and the options' rules."""

from __future__ import annotations

import dataclasses

import pytest

from pipeweave.ir import lower, parse_action
from pipeweave.runtime import run_local
from pipeweave.runtime.checkpoint.boundaries import combine_hooks, iteration_boundaries
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


@pytest.mark.parametrize("schedule", ["pipedream", "2bw", "pipeoptim"])
def test_asynchronous_schedules_are_rejected_with_the_reason(schedule: str, tmp_path) -> None:
    job = with_checkpoints(mlp_job(depth=2, schedule=schedule), directory=str(tmp_path))
    with pytest.raises(ValueError, match=rf"needs a synchronous schedule, and '{schedule}' is "
                                         rf"asynchronous.*Use gpipe, 1f1b"):
        run_local(job)
    assert not list(tmp_path.iterdir())


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
