"""interleaved-1f1b: Megatron's rule, literal orders, the bubble closed form, 1F1B at v=1."""

from __future__ import annotations

import pytest

from pipeweave.ir import Action, Op, Schedule, lower, validate, walk
from pipeweave.schedules import Shape, build_schedule
from pipeweave.schedules.interleaved import interleaved_1f1b, interleaved_order


def rows(schedule: Schedule) -> list[str]:
    """Each rank's program as text, F/B without their (per-iteration) version."""
    def text(a: Action) -> str:
        return str(a.with_(version=None)) if a.is_compute else str(a)
    return [" ".join(text(a) for a in program) for program in schedule.programs]


def unit(_rank: int, action: Action) -> float:
    return 1.0 if action.is_compute else 0.0


def test_literal_two_ranks_two_chunks() -> None:
    # P=2, v=2, M=2: stages 0,2 on rank 0 and 1,3 on rank 1. Rank 0 warms up with
    # (2-0-1)*2 + (2-1)*2 = 4 = M*v forwards (all of them), rank 1 with 0*2 + 2 = 2.
    s = build_schedule("interleaved-1f1b", stages=2, microbatches=2, chunks=2)
    assert rows(s) == [
        "0F0 0F1 2F0 2F1 2B0 2B1 0B0 0B1 0U@1 2U@1",
        "1F0 1F1 3F0 3B0 3F1 3B1 1B0 1B1 1U@1 3U@1",
    ]
    # the module docstring's unit-cost timeline
    w = walk(s, unit)
    assert [[w.start[r][i] for i in range(8)] for r in range(2)] == [
        [0, 1, 2, 3, 5, 7, 8, 9],
        [1, 2, 3, 4, 5, 6, 7, 8],
    ]


def test_literal_three_ranks_two_chunks() -> None:
    # P=3, v=2, M=3, worked by hand from Megatron's rule (runs of P micro-batches per chunk,
    # backwards through the chunks in reverse):
    #   rank 0: warm-up (3-0-1)*2 + 3 = 7 -> capped at M*v = 6: every forward, then backwards
    #   rank 1: warm-up (3-1-1)*2 + 3 = 5, one F/B pair, cool-down
    #   rank 2: warm-up 3, then F/B pairs on chunk 1, cool-down on chunk 0
    s = build_schedule("interleaved-1f1b", stages=3, microbatches=3, chunks=2)
    assert rows(s) == [
        "0F0 0F1 0F2 3F0 3F1 3F2 3B0 3B1 3B2 0B0 0B1 0B2 0U@1 3U@1",
        "1F0 1F1 1F2 4F0 4F1 4F2 4B0 4B1 4B2 1B0 1B1 1B2 1U@1 4U@1",
        "2F0 2F1 2F2 5F0 5B0 5F1 5B1 5F2 5B2 2B0 2B1 2B2 2U@1 5U@1",
    ]


def test_microbatches_go_through_chunks_in_runs_of_p() -> None:
    # P=2, v=2, M=4 on rank 1 (warm-up 0*2 + 2 = 2): chunk 0 for micro-batches 0,1, chunk 1
    # for 0,1, then chunk 0 for 2,3 ...; backwards start on the last chunk.
    order = interleaved_order(1, 2, 2, [0, 1, 2, 3])
    assert [f"{s}{op.value}{j}" for op, s, j in order] == [
        "1F0", "1F1", "3F0", "3B0", "3F1", "3B1", "1F2", "1B0", "1F3", "1B1",
        "3F2", "3B2", "3F3", "3B3", "1B2", "1B3",
    ]


@pytest.mark.parametrize("stages,microbatches,chunks", [(2, 4, 2), (4, 8, 2), (4, 8, 3), (3, 6, 4)])
def test_warmup_follows_megatron(stages: int, microbatches: int, chunks: int) -> None:
    s = build_schedule("interleaved-1f1b", stages=stages, microbatches=microbatches, chunks=chunks)
    for rank, program in enumerate(s.programs):
        first_backward = next(i for i, a in enumerate(program) if a.op is Op.BACKWARD)
        expected = min((stages - rank - 1) * 2 + (chunks - 1) * stages, microbatches * chunks)
        # the first backward follows the first steady-state forward unless all are warm-up
        assert first_backward == min(expected + 1, microbatches * chunks)


@pytest.mark.parametrize("stages,microbatches", [(2, 4), (3, 6), (4, 4), (4, 8), (4, 12)])
@pytest.mark.parametrize("chunks", [1, 2, 3, 4])
def test_iteration_time_closed_form(stages: int, microbatches: int, chunks: int) -> None:
    # A chunk costs 1/v of a stage (F=1, B=2 per whole stage): Megatron's iteration time
    # (M + (P-1)/v)(F+B), i.e. the 1F1B bubble divided by v.
    s = build_schedule("interleaved-1f1b", stages=stages, microbatches=microbatches, chunks=chunks)
    w = walk(s, lambda _r, a: ((1.0 if a.op is Op.FORWARD else 2.0) / chunks) if a.is_compute else 0.0)
    assert w.makespan == pytest.approx((microbatches + (stages - 1) / chunks) * 3)


@pytest.mark.parametrize("stages,microbatches,iterations", [(1, 1, 1), (1, 3, 2), (3, 5, 2), (4, 4, 1)])
def test_one_chunk_is_plain_1f1b(stages: int, microbatches: int, iterations: int) -> None:
    s = build_schedule("interleaved-1f1b", stages=stages, microbatches=microbatches,
                       iterations=iterations)
    ref = build_schedule("1f1b", stages=stages, microbatches=microbatches, iterations=iterations)
    assert s.programs == ref.programs
    assert s.layout == ref.layout


def test_versions_follow_iterations() -> None:
    s = build_schedule("interleaved-1f1b", stages=2, microbatches=4, iterations=3, chunks=2)
    for program in s.programs:
        for a in program:
            if a.is_compute:
                assert a.version == a.microbatch // 4
        assert [a.version for a in program if a.op is Op.STEP] == [1, 1, 2, 2, 3, 3]


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
@pytest.mark.parametrize("chunks", [1, 2, 3])
@pytest.mark.parametrize("runs", [1, 2])
@pytest.mark.parametrize("iterations", [1, 2])
@pytest.mark.parametrize("width", [1, 2])
def test_validator_accepts(stages: int, chunks: int, runs: int, iterations: int, width: int) -> None:
    s = build_schedule("interleaved-1f1b", stages=stages, microbatches=stages * runs * width,
                       iterations=iterations, chunks=chunks, width=width)
    validate(s)
    validate(lower(s))


def test_width_all_reduces_before_each_update() -> None:
    s = build_schedule("interleaved-1f1b", stages=2, microbatches=4, chunks=2, width=2)
    assert s.num_ranks == 4
    for program in s.programs:
        tail = [str(a) for a in program if not a.is_compute]
        assert len(tail) == 4 and tail[0].endswith("AR@1") and tail[1].endswith("U@1")


def test_rejects_microbatches_not_a_multiple_of_stages() -> None:
    with pytest.raises(ValueError, match=r"M=6.*P=4.*use M=8"):
        build_schedule("interleaved-1f1b", stages=4, microbatches=6, chunks=2)
    with pytest.raises(ValueError, match=r"microbatches >= 4"):
        build_schedule("interleaved-1f1b", stages=4, microbatches=2, chunks=2)
    with pytest.raises(ValueError, match=r"M=3.*use M=4"):
        interleaved_1f1b(Shape(stages=2, microbatches=3, chunks=2))
    with pytest.raises(ValueError, match=r"replicas"):
        interleaved_1f1b(Shape(stages=2, microbatches=2, chunks=2, replicas=(1, 2)))
