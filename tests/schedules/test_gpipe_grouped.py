"""gpipe-grouped (WPipe appendix A.4): literal orders, the bubble closed form, gpipe at v=1."""

from __future__ import annotations

import pytest

from pipeweave.ir import Action, Op, Schedule, lower, validate
from pipeweave.schedules import build_schedule
from pipeweave.sim import Costs, simulate

from unit_timeline import timeline


def rows(schedule: Schedule) -> list[str]:
    def text(a: Action) -> str:
        return str(a.with_(version=None)) if a.is_compute else str(a)
    return [" ".join(text(a) for a in program) for program in schedule.programs]


def test_literal_two_ranks_two_groups() -> None:
    # Fig. 15's shape: 2 partitions cut into 4 stages, G0 = {0, 1}, G1 = {2, 3}; each rank
    # forwards G0 then G1 for every micro-batch, backwards G1 then G0, one update per stage.
    s = build_schedule("gpipe-grouped", stages=2, microbatches=2, chunks=2)
    assert rows(s) == [
        "0F0 0F1 2F0 2F1 2B0 2B1 0B0 0B1 0U@1 2U@1",
        "1F0 1F1 3F0 3F1 3B0 3B1 1B0 1B1 1U@1 3U@1",
    ]
    assert timeline(s) == [
        "0F0 0F1 2F0 2F1 .   .   2B0 2B1 0B0 0B1",
        ".   1F0 1F1 3F0 3F1 3B0 3B1 1B0 1B1 .",
    ]
    assert {a.version for p in s.programs for a in p if a.is_compute} == {0}


def test_literal_three_groups_two_iterations() -> None:
    s = build_schedule("gpipe-grouped", stages=2, microbatches=2, chunks=3, iterations=2)
    assert rows(s)[1] == (
        "1F0 1F1 3F0 3F1 5F0 5F1 5B0 5B1 3B0 3B1 1B0 1B1 1U@1 3U@1 5U@1 "
        "1F2 1F3 3F2 3F3 5F2 5F3 5B2 5B3 3B2 3B3 1B2 1B3 1U@2 3U@2 5U@2"
    )


def test_one_chunk_is_gpipe() -> None:
    for p, m in [(1, 1), (3, 4), (4, 2)]:
        assert build_schedule("gpipe-grouped", stages=p, microbatches=m).programs == \
            build_schedule("gpipe", stages=p, microbatches=m).programs


def test_width_routes_microbatches_to_copies() -> None:
    s = build_schedule("gpipe-grouped", stages=2, microbatches=4, chunks=2, width=2)
    validate(lower(s))
    # copy 0 (ranks 0, 1) runs the even micro-batches, copy 1 (ranks 2, 3) the odd ones
    assert rows(s)[0] == "0F0 0F2 2F0 2F2 2B0 2B2 0B0 0B2 0AR@1 0U@1 2AR@1 2U@1"
    assert rows(s)[3] == "1F1 1F3 3F1 3F3 3B1 3B3 1B1 1B3 1AR@1 1U@1 3AR@1 3U@1"


def unit_makespan(stages: int, microbatches: int, chunks: int) -> float:
    s = build_schedule("gpipe-grouped", stages=stages, microbatches=microbatches, chunks=chunks)
    return simulate(lower(s), Costs(forward=1.0, backward=1.0)).iteration_time


@pytest.mark.parametrize("stages", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("chunks", [1, 2, 3, 4])
@pytest.mark.parametrize("microbatches", [1, 2, 3, 4, 6, 8, 12])
def test_bubble_closed_form(stages: int, microbatches: int, chunks: int) -> None:
    # chunk passes cost f = b = 1: each phase (all forwards, all backwards) is
    # (v-1) max(M, P) + M + P - 1 passes; with M >= P that is vM + P - 1 and the bubble
    # fraction is (P-1)/(vM+P-1)
    s = build_schedule("gpipe-grouped", stages=stages, microbatches=microbatches, chunks=chunks)
    result = simulate(lower(s), Costs(forward=1.0, backward=1.0))
    longest = max(microbatches, stages)
    assert result.iteration_time == 2 * ((chunks - 1) * longest + microbatches + stages - 1)
    if microbatches >= stages:
        assert result.iteration_time == 2 * (chunks * microbatches + stages - 1)
        assert result.bubble_fraction == pytest.approx(
            (stages - 1) / (chunks * microbatches + stages - 1), abs=1e-12)


@pytest.mark.parametrize("stages,microbatches", [(2, 2), (2, 4), (4, 4), (4, 8)])
def test_two_groups_halve_gpipes_bubble(stages: int, microbatches: int) -> None:
    # the same model: a GPipe partition's passes cost 2 chunk passes (F = B = 2)
    gpipe = simulate(lower(build_schedule("gpipe", stages=stages, microbatches=microbatches)),
                     Costs(forward=2.0, backward=2.0)).iteration_time
    grouped = unit_makespan(stages, microbatches, 2)
    work = microbatches * 4  # per rank, identical in both
    assert gpipe == (microbatches + stages - 1) * 4
    assert grouped - work == (gpipe - work) / 2


def test_point_to_point_messages_grow_with_groups() -> None:
    # appendix A.4's price: every one of the vP - 1 boundaries crosses ranks
    for chunks in (1, 2, 3):
        lowered = lower(build_schedule("gpipe-grouped", stages=3, microbatches=3, chunks=chunks))
        sends = sum(a.op is Op.SEND_ACT for p in lowered.programs for a in p)
        assert sends == 3 * (3 * chunks - 1)
