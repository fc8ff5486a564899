"""avgpipe: advance forward propagation (Fig. 7), its 1F1B/AFAB limits, N parallel pipelines."""

from __future__ import annotations

import re

import pytest

from pipeweave.ir import Action, Op, Schedule, lower, validate, walk
from pipeweave.schedules import Shape, build_schedule
from pipeweave.schedules.avgpipe import avgpipe


def rows(schedule: Schedule) -> list[str]:
    def text(a: Action) -> str:
        return str(a.with_(version=None)) if a.is_compute else str(a)
    return [" ".join(text(a) for a in program) for program in schedule.programs]


def compute(schedule: Schedule) -> list[list[Action]]:
    return [[a for a in program if a.is_compute] for program in schedule.programs]


def peak_activations(program: list[Action], stage: int, pipeline: int = 0) -> int:
    live = peak = 0
    for a in program:
        if a.stage == stage and a.pipeline == pipeline:
            live += (a.op is Op.FORWARD) - (a.op is Op.BACKWARD)
            peak = max(peak, live)
    return peak


def test_figure_7_two_gpus() -> None:
    # Fig. 7(b), 1F1B: the first GPU stashes two micro-batches.
    s = build_schedule("avgpipe", stages=2, microbatches=4)
    assert rows(s) == [
        "0F0 0F1 0B0 0F2 0B1 0F3 0B2 0B3 0U@1 0AV@1",
        "1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3 1U@1 1AV@1",
    ]
    assert peak_activations(list(s.programs[0]), 0) == 2
    # Fig. 7(c), micro-batch 2 (the paper's "3") forwarded in advance: the first GPU stashes
    # three; the second GPU computes micro-batches 0 and 1 while it arrives.
    s = build_schedule("avgpipe", stages=2, microbatches=4, advance=1)
    assert rows(s) == [
        "0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3 0U@1 0AV@1",
        "1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3 1U@1 1AV@1",
    ]
    assert peak_activations(list(s.programs[0]), 0) == 3
    w = walk(s, lambda _r, a: 1.0 if a.is_compute else 0.0)
    assert w.start[0][:8] == [0, 1, 2, 4, 5, 6, 8, 9]  # the module docstring's timeline


def test_literal_three_stages_advance_one() -> None:
    # P=3, M=4, advance=1: stage s warms up with min(P - s - 1 + 1, M) = 3, 2, 1 forwards.
    s = build_schedule("avgpipe", stages=3, microbatches=4, advance=1)
    assert rows(s) == [
        "0F0 0F1 0F2 0F3 0B0 0B1 0B2 0B3 0U@1 0AV@1",
        "1F0 1F1 1F2 1B0 1F3 1B1 1B2 1B3 1U@1 1AV@1",
        "2F0 2F1 2B0 2F2 2B1 2F3 2B2 2B3 2U@1 2AV@1",
    ]


@pytest.mark.parametrize("stages", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("microbatches", [1, 2, 4, 7])
@pytest.mark.parametrize("advance", [0, 1, 2, 3, 10])
def test_stashed_activations(stages: int, microbatches: int, advance: int) -> None:
    # stage 0 holds min(P + advance, M) activations (1F1B: min(P, M)); stage s min(P-s+a, M)
    s = build_schedule("avgpipe", stages=stages, microbatches=microbatches, advance=advance)
    for stage, program in enumerate(s.programs):
        assert peak_activations(list(program), stage) == min(stages - stage + advance, microbatches)


@pytest.mark.parametrize("stages,microbatches,iterations", [(1, 1, 1), (2, 4, 2), (3, 3, 1),
                                                            (4, 6, 2), (4, 2, 1)])
def test_degenerates_to_1f1b_and_to_afab(stages: int, microbatches: int, iterations: int) -> None:
    shape = dict(stages=stages, microbatches=microbatches, iterations=iterations)
    one_f_one_b = build_schedule("1f1b", **shape)
    assert compute(build_schedule("avgpipe", **shape)) == compute(one_f_one_b)
    assert compute(build_schedule("avgpipe", advance=0, **shape)) == compute(one_f_one_b)
    gpipe = compute(build_schedule("gpipe", **shape))
    for advance in ("all", max(microbatches - 1, 0), microbatches + 5):
        assert compute(build_schedule("avgpipe", advance=advance, **shape)) == gpipe


def test_literal_two_pipelines() -> None:
    # N=2 on P=2 ranks: at every step of the 1F1B timeline each rank runs that step for
    # pipeline 0 then pipeline 1; each pipeline updates and averages on its own.
    s = build_schedule("avgpipe", stages=2, microbatches=2, pipelines=2)
    assert s.pipelines == 2
    assert rows(s) == [
        "0F0 0F0#1 0F1 0F1#1 0B0 0B0#1 0B1 0B1#1 0U@1 0AV@1 0U@1#1 0AV@1#1",
        "1F0 1F0#1 1B0 1B0#1 1F1 1F1#1 1B1 1B1#1 1U@1 1AV@1 1U@1#1 1AV@1#1",
    ]


@pytest.mark.parametrize("pipelines", [1, 2, 3])
@pytest.mark.parametrize("advance", [0, 1, "all"])
@pytest.mark.parametrize("stages,microbatches,iterations", [(1, 1, 1), (2, 2, 2), (3, 5, 2),
                                                            (4, 4, 1), (4, 8, 2)])
def test_parallel_pipelines_complete_and_deadlock_free(
    pipelines: int, advance: object, stages: int, microbatches: int, iterations: int
) -> None:
    shape = dict(stages=stages, microbatches=microbatches, iterations=iterations, advance=advance)
    s = build_schedule("avgpipe", pipelines=pipelines, **shape)
    validate(s)  # every pipeline's every micro-batch forwarded and backwarded once, no deadlock
    validate(lower(s))
    single = build_schedule("avgpipe", **shape)
    for rank, program in enumerate(s.programs):
        for p in range(pipelines):
            own = [a for a in program if a.pipeline == p]
            assert own == [a.with_(pipeline=p) for a in single.programs[rank]]
            steps = [(a.op, a.version) for a in own if a.microbatch is None]
            assert steps == [(op, k + 1) for k in range(iterations) for op in (Op.STEP, Op.AVERAGE)]


def test_width_all_reduces_before_the_update() -> None:
    s = build_schedule("avgpipe", stages=2, microbatches=4, width=2, pipelines=2)
    validate(s)
    for program in s.programs:
        tail = [str(a) for a in program if not a.is_compute]
        assert [t[1:] for t in tail] == ["AR@1", "U@1", "AV@1", "AR@1#1", "U@1#1", "AV@1#1"]


@pytest.mark.parametrize("bad", [-1, 1.5, "some", True])
def test_rejects_bad_advance(bad: object) -> None:
    with pytest.raises(ValueError, match=r"advance must be an integer >= 0 .* got " + re.escape(repr(bad))):
        build_schedule("avgpipe", stages=2, microbatches=4, advance=bad)


def test_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match=r"chunks=2; set chunks=1"):
        avgpipe(Shape(stages=2, microbatches=2, chunks=2))
    with pytest.raises(ValueError, match=r"replicas"):
        avgpipe(Shape(stages=2, microbatches=2, replicas=(1, 2)))


@pytest.mark.parametrize("advance", [0, 1, "all"])
@pytest.mark.parametrize("pipelines,width", [(1, 1), (2, 1), (3, 1), (2, 2)])
def test_one_iteration_is_that_iteration_of_the_whole_run(advance: object, pipelines: int,
                                                          width: int) -> None:
    # The online advance controller (runtime/advance/online.py) runs iteration k alone, laid
    # out with first_iteration=k: it must be exactly iteration k of the run, in run order.
    # M=3 with width=2: micro-batch numbers decide the replica, so numbering must be global.
    shape = dict(stages=3, microbatches=3, pipelines=pipelines, width=width)
    whole = lower(build_schedule("avgpipe", iterations=4, advance=advance, **shape))

    def iteration(action: Action) -> int:
        if action.microbatch is not None:
            return action.microbatch // 3
        assert action.version is not None
        return action.version - 1

    for k in range(4):
        # (no validate(): it counts micro-batches from 0; iteration k is proven by equality)
        alone = lower(build_schedule("avgpipe", iterations=1, advance=advance,
                                     first_iteration=k, **shape))
        for rank, program in enumerate(whole.programs):
            assert list(alone.programs[rank]) == [a for a in program if iteration(a) == k]
    two = build_schedule("avgpipe", iterations=2, advance=advance, first_iteration=2, **shape)
    assert [a for p in two.programs for a in p] == [
        a for p in whole.compute_only().programs for a in p if iteration(a) >= 2]


def test_first_iteration_must_be_a_count() -> None:
    with pytest.raises(ValueError, match="first_iteration must be an integer >= 0"):
        build_schedule("avgpipe", stages=2, microbatches=2, first_iteration=-1)
