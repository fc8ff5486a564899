"""sliced-1f1b: AutoPipe's Slicer (Fig. 8(b)), its halved startup, and Algorithm 2."""

from __future__ import annotations

import math

import pytest

from pipeweave.ir import Action, Op, Schedule, lower, validate, walk
from pipeweave.schedules import build_schedule
from pipeweave.schedules.sliced import slice_forwards, slicer_count


def rows(schedule: Schedule) -> list[str]:
    def text(a: Action) -> str:
        return str(a.with_(version=None)) if a.is_compute else str(a)
    return [" ".join(text(a) for a in program) for program in schedule.programs]


def cost(_rank: int, action: Action) -> float:
    """F=1 per whole micro-batch (0.5 per half), B=2, no communication cost."""
    if action.op is Op.FORWARD:
        return 0.5 if action.piece else 1.0
    return 2.0 if action.op is Op.BACKWARD else 0.0


def first_on_last_stage(schedule: Schedule, op: Op) -> float:
    w = walk(schedule, cost)
    program = schedule.programs[-1]
    return next(w.start[-1][i] for i, a in enumerate(program) if a.op is op)


def test_literal_figure_8b() -> None:
    # 4 stages, 4 micro-batches, micro-batch 0 sliced: its forward is two halves on every
    # stage, its backward whole; the rest is 1F1B.
    s = build_schedule("sliced-1f1b", stages=4, microbatches=4, sliced=1)
    assert rows(s) == [
        "0F0a 0F0b 0F1 0F2 0F3 0B0 0B1 0B2 0B3 0U@1",
        "1F0a 1F0b 1F1 1F2 1B0 1F3 1B1 1B2 1B3 1U@1",
        "2F0a 2F0b 2F1 2B0 2F2 2B1 2F3 2B2 2B3 2U@1",
        "3F0a 3F0b 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3U@1",
    ]
    # the module docstring's timeline: the last stage starts at 1.5 instead of 3
    w = walk(s, cost)
    assert w.start[3][:4] == [1.5, 2.0, 2.5, 4.5]


def test_literal_small_pipelines() -> None:
    s = build_schedule("sliced-1f1b", stages=2, microbatches=3, sliced=1)
    assert rows(s) == [
        "0F0a 0F0b 0F1 0B0 0F2 0B1 0B2 0U@1",
        "1F0a 1F0b 1B0 1F1 1B1 1F2 1B2 1U@1",
    ]
    s = build_schedule("sliced-1f1b", stages=3, microbatches=3, sliced=2)
    assert rows(s) == [
        "0F0a 0F0b 0F1a 0F1b 0F2 0B0 0B1 0B2 0U@1",
        "1F0a 1F0b 1F1a 1F1b 1B0 1F2 1B1 1B2 1U@1",
        "2F0a 2F0b 2B0 2F1a 2F1b 2B1 2F2 2B2 2U@1",
    ]
    # every iteration has its own warm-up, so its first micro-batch is sliced
    s = build_schedule("sliced-1f1b", stages=2, microbatches=2, iterations=2, sliced=1)
    assert rows(s) == [
        "0F0a 0F0b 0F1 0B0 0B1 0U@1 0F2a 0F2b 0F3 0B2 0B3 0U@2",
        "1F0a 1F0b 1B0 1F1 1B1 1U@1 1F2a 1F2b 1B2 1F3 1B3 1U@2",
    ]


@pytest.mark.parametrize("stages", [2, 3, 4, 5, 6, 8])
def test_startup_overhead_is_halved(stages: int) -> None:
    # §II-B: startup overhead = how long the last stage waits for the first activation:
    # (P-1) F in 1F1B, (P-1) F/2 once micro-batch 0 travels in halves; its first backward
    # moves from P to (P+1)/2.
    plain = build_schedule("1f1b", stages=stages, microbatches=2 * stages)
    sliced = build_schedule("sliced-1f1b", stages=stages, microbatches=2 * stages, sliced=1)
    assert first_on_last_stage(plain, Op.FORWARD) == stages - 1
    assert first_on_last_stage(sliced, Op.FORWARD) == (stages - 1) / 2
    assert first_on_last_stage(plain, Op.BACKWARD) == stages
    assert first_on_last_stage(sliced, Op.BACKWARD) == (stages + 1) / 2


@pytest.mark.parametrize("stages", [1, 2, 3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize("runs", [1, 2])
def test_algorithm_2_count_removes_half_the_startup_from_the_iteration(stages: int, runs: int) -> None:
    # With Algorithm 2's k (the default), the whole iteration is (P-1) F/2 shorter than 1F1B.
    M = stages * runs
    plain = walk(build_schedule("1f1b", stages=stages, microbatches=M), cost).makespan
    sliced = build_schedule("sliced-1f1b", stages=stages, microbatches=M)
    assert sliced.options["sliced"] == min(max(1, math.ceil(stages / 4)), M)
    assert walk(sliced, cost).makespan == plain - (stages - 1) / 2
    if stages >= 6:  # there one sliced micro-batch is not enough: stage 0 cannot keep up
        one = build_schedule("sliced-1f1b", stages=stages, microbatches=M, sliced=1)
        assert walk(one, cost).makespan > plain - (stages - 1) / 2


def test_slicing_holds_no_extra_activations() -> None:
    # the two halves of a micro-batch together hold one micro-batch (0.5 each)
    for stages, M, k in ((4, 4, 1), (4, 8, 3), (3, 6, 2)):
        sliced = build_schedule("sliced-1f1b", stages=stages, microbatches=M, sliced=k)
        plain = build_schedule("1f1b", stages=stages, microbatches=M)
        for a, b in zip(sliced.programs, plain.programs):
            assert _peak(list(a)) == _peak(list(b))


def _peak(program: list[Action]) -> float:
    live = peak = 0.0
    for a in program:
        if a.op is Op.FORWARD:
            live += 0.5 if a.piece else 1.0
        elif a.op is Op.BACKWARD:
            live -= 1.0
        peak = max(peak, live)
    return peak


def test_slicer_count_by_hand() -> None:
    # Uniform f=1, b=2, Comm=0, p=4 (lines 6-15): tempt = 3*0.5 + 0.5 = 2, startt = [4, 6, 8, 10].
    # mb=1: lines 17-28 give endt = [0.5, 1], [1, 1.5], [1.5, 2], [2, 2.5] for stages 0..3;
    # line 29 tempt = startt[0] = 4, lines 30-33 subtract f_2 + f_1 + f_0 -> 1 >= endt[0][1] = 1.
    assert slicer_count([1, 1, 1, 1], [2, 2, 2, 2], 0) == 1
    # p=6: tempt = 5*0.5 + 0.5 = 3, startt[0] = 5, startt[1] = 7. mb=1: 5 - 4 - 1 = 0 < 1.
    # mb=2 (stages 0..4): endt[0] = [max(1 + 0.5, endt[1][1] = 1.5), 2] = [1.5, 2];
    # tempt = 7 - f_3 - f_2 - f_1 - f_0 = 3 >= 2 -> 2.
    assert slicer_count([1] * 6, [2] * 6, 0) == 2
    # A heavy last stage: f = [1, 1, 1, 3], b = [2, 2, 2, 6]: tempt = 1.5 + 1.5 = 3,
    # startt[0] = 3 + 6 = 9; mb=1: 9 - f_2 - f_1 - f_0 = 6 >= endt[0][1] = 1 -> 1.
    assert slicer_count([1, 1, 1, 3], [2, 2, 2, 6], 0) == 1
    # Communication Comm=1, p=4, uniform: tempt = 3*(0.5 + 0.5) + 0.5 = 3.5, startt[0] = 6.5,
    # startt[1] = 9.5. mb=1: endt[0][0] = 0.5 + 0.5 = 1, endt[0][1] = 1 + 0.5 + 0.5 = 2;
    # tempt = 6.5 - 2*(1 + 1) - 1 = 1.5 < 2. mb=2: endt[0][0] = max(2 + 1, endt[1][1] = 3) = 3,
    # endt[0][1] = 4; tempt = 9.5 - (1 + 1) - 1 = 6.5 >= 4 -> 2.
    assert slicer_count([1] * 4, [2] * 4, 1) == 2
    # One stage: tempt = 0.5 + 2 = 2.5 = startt[0]; mb=1: 2.5 - 1 = 1.5 >= endt[0][1] = 1 -> 1.
    assert slicer_count([1], [2], 0) == 1


@pytest.mark.parametrize("stages", range(1, 13))
def test_slicer_count_uniform_closed_form(stages: int) -> None:
    # For f=1, b=2, Comm=0 the lines give tempt = 3 mb - p/2 and endt[0][1] = mb, so Algorithm 2
    # returns the first mb >= p/4.
    assert slicer_count([1] * stages, [2] * stages, 0) == max(1, math.ceil(stages / 4))


def test_options_choose_the_count() -> None:
    assert build_schedule("sliced-1f1b", stages=8, microbatches=8).options["sliced"] == 2
    costs = ([1, 1, 1, 1], [2, 2, 2, 2], 1.0)
    assert build_schedule("sliced-1f1b", stages=4, microbatches=8, costs=costs).options["sliced"] == 2
    assert build_schedule("sliced-1f1b", stages=4, microbatches=8, sliced=3).options["sliced"] == 3
    assert build_schedule("sliced-1f1b", stages=8, microbatches=1).options["sliced"] == 1  # <= M
    zero = build_schedule("sliced-1f1b", stages=3, microbatches=5, iterations=2, sliced=0)
    assert zero.programs == build_schedule("1f1b", stages=3, microbatches=5, iterations=2).programs


def test_slice_forwards_keeps_backwards_whole() -> None:
    program = [Action(Op.FORWARD, 0, 0, version=0), Action(Op.FORWARD, 0, 1, version=0),
               Action(Op.BACKWARD, 0, 0, version=0)]
    assert [str(a) for a in slice_forwards(program, {0})] == ["0F0a@0", "0F0b@0", "0F1@0", "0B0@0"]


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
@pytest.mark.parametrize("microbatches", [1, 2, 4, 5])
@pytest.mark.parametrize("iterations", [1, 2])
@pytest.mark.parametrize("options", [{}, {"sliced": 1}, {"sliced": 2}, {"costs": "uniform-comm"}])
@pytest.mark.parametrize("width", [1, 2])
def test_validator_accepts(stages: int, microbatches: int, iterations: int, options: dict[str, object],
                           width: int) -> None:
    if options.get("costs"):
        options = {"costs": ([1.0] * stages, [2.0] * stages, 0.5)}
    if options.get("sliced", 0) > microbatches:  # type: ignore[operator]
        options = {"sliced": microbatches}
    s = build_schedule("sliced-1f1b", stages=stages, microbatches=microbatches * width,
                       iterations=iterations, width=width, **options)
    validate(s)
    validate(lower(s))


def test_replicated_stages_slice_the_same_micro_batches() -> None:
    s = build_schedule("sliced-1f1b", stages=3, microbatches=6, replicas=(1, 1, 2), sliced=2)
    validate(s)
    validate(lower(s))
    halves = {(a.stage, a.microbatch) for _, _, a in s.actions() if a.piece == 1}
    assert halves == {(stage, j) for stage in range(3) for j in (0, 1)}


@pytest.mark.parametrize("options,message", [
    ({"sliced": -1}, r"sliced must be an integer in 0..M=4 .* got -1; e.g. sliced=1"),
    ({"sliced": 5}, r"got 5"),
    ({"sliced": "2"}, r"got '2'"),
    ({"sliced": 1, "costs": ([1] * 4, [2] * 4, 0)}, r"either sliced=k or costs"),
    ({"costs": ([1] * 3, [2] * 4, 0)}, r"forward times must list one time per stage \(4\)"),
    ({"costs": ([1] * 4, [2] * 4, -1)}, r"comm must be a number >= 0, got -1"),
    ({"costs": ([1] * 4, [2, 2, 2, "x"], 0)}, r"backward times must be numbers >= 0"),
    ({"costs": 3}, r"costs must be a triple"),
])
def test_rejects_bad_options(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_schedule("sliced-1f1b", stages=4, microbatches=4, **options)
    with pytest.raises(ValueError, match=r"one forward and one backward time per stage"):
        slicer_count([1, 1], [2], 0)
