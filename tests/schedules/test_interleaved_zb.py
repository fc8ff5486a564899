"""interleaved-zb: Megatron's interleaved F/I order, W's filling bubbles within 1F1B's peak memory.

Timelines as in the papers' figures: one row per rank, one column per unit step (every pass
costs 1, messages are free), ``.`` where the rank idles. Memory is counted from the programs: a
chunk activation is alive from its ``F`` to its ``W`` (``B`` when not split).
"""

from __future__ import annotations

import pytest

from pipeweave.ir import Action, Layout, Op, Schedule, lower, validate, walk
from pipeweave.schedules import Shape, build_schedule, get_info
from pipeweave.schedules.common import copies_schedule
from pipeweave.schedules.interleaved_zb import interleaved_zb, interleaved_zb_order, megatron_passes
from unit_timeline import held, timeline, unit


def split_cost(_rank: int, action: Action) -> float:
    """``B = I + W`` so that interleaved-1f1b is timed on the same footing."""
    return 2.0 if action.op is Op.BACKWARD else unit(_rank, action)


def build(stages: int, microbatches: int, chunks: int, name: str = "interleaved-zb",
          **kw: object) -> Schedule:
    """The registered schedule; for interleaved-zb with one chunk, its order on a straight
    pipeline (the registered one is plain 1f1b, as interleaved-1f1b's)."""
    if name == "interleaved-zb" and chunks == 1:
        shape = Shape(stages=stages, microbatches=microbatches, **kw)  # type: ignore[arg-type]
        return copies_schedule("zb-h1", shape, Layout.straight(stages),
                               lambda P, M: interleaved_zb_order(P, M, 1))
    return build_schedule(name, stages=stages, microbatches=microbatches, chunks=chunks, **kw)


def test_literal_two_ranks_two_chunks() -> None:
    # the module docstring's figure: 13 steps = 3Mv + P - 1
    assert timeline(build(2, 2, 2)) == [
        "0F0 0F1 2F0 2F1 .   2I0 2W0 2I1 0I0 0I1 2W1 0W0 0W1",
        ".   1F0 1F1 3F0 3I0 3F1 3I1 1I0 1I1 3W0 3W1 1W0 1W1",
    ]


def test_literal_one_chunk_is_zb_h1_like() -> None:
    # the order with one chunk (not registered yet): 1F1B's order with I for B; the last stage runs F I F I F I and leaves its W's to the end,
    # the first waits for the gradients and does each W beside its I: 11 steps = 3M + P - 1
    assert timeline(build(3, 3, 1)) == [
        "0F0 0F1 0F2 .   .   0I0 0W0 0I1 0W1 0I2 0W2",
        ".   1F0 1F1 .   1I0 1F2 1I1 1W0 1I2 1W1 1W2",
        ".   .   2F0 2I0 2F1 2I1 2F2 2I2 2W0 2W1 2W2",
    ]


def test_literal_four_ranks_two_chunks() -> None:
    assert timeline(build(4, 4, 2)) == [
        "0F0 0F1 0F2 0F3 4F0 4F1 4F2 4F3 .   .   .   4I0 4W0 4I1 4W1 4I2 4W2 4I3 0I0 0I1 0I2 0I3 4W3 0W0 0W1 0W2 0W3",
        ".   1F0 1F1 1F2 1F3 5F0 5F1 5F2 5F3 .   5I0 5W0 5I1 5W1 5I2 5W2 5I3 1I0 1I1 1I2 1I3 5W3 1W0 1W1 1W2 1W3 .",
        ".   .   2F0 2F1 2F2 2F3 6F0 6F1 6F2 6I0 6F3 6I1 6W0 6I2 6W1 6I3 2I0 2I1 2I2 2I3 6W2 6W3 2W0 2W1 2W2 2W3 .",
        ".   .   .   3F0 3F1 3F2 3F3 7F0 7I0 7F1 7I1 7F2 7I2 7F3 7I3 3I0 3I1 3I2 3I3 7W0 7W1 7W2 7W3 3W0 3W1 3W2 3W3",
    ]


@pytest.mark.parametrize("stages", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("chunks", [1, 2, 3])
def test_forwards_and_input_gradients_keep_megatrons_order(stages: int, chunks: int) -> None:
    s = build(stages, 2 * stages, chunks)
    for rank, program in enumerate(s.programs):
        got = [(a.op, a.stage, a.microbatch) for a in program
               if a.op in (Op.FORWARD, Op.BACKWARD_INPUT)]
        assert got == megatron_passes(rank, stages, chunks, 2 * stages)


@pytest.mark.parametrize("stages", [1, 2, 3, 4, 6, 8])
@pytest.mark.parametrize("chunks", [1, 2, 3])
def test_fill_is_a_third_of_interleaved_1f1b_within_its_peak_memory(stages: int, chunks: int) -> None:
    for microbatches in (stages, 2 * stages, 4 * stages):
        zb = build(stages, microbatches, chunks)
        megatron = build(stages, microbatches, chunks, name="interleaved-1f1b")
        work = 3 * microbatches * chunks  # F, I and W of every chunk, one step each
        assert walk(zb, unit).makespan == work + stages - 1
        assert walk(megatron, split_cost).makespan == work + 3 * (stages - 1)
        # ZB-H1's rule: no rank above interleaved 1F1B's fullest rank
        assert max(held(p) for p in zb.programs) <= max(held(p) for p in megatron.programs)
        assert held(zb.programs[0]) == held(megatron.programs[0])


def test_one_chunk_registered_is_plain_1f1b() -> None:
    s = build_schedule("interleaved-zb", stages=3, microbatches=5, iterations=2)
    assert s.programs == build_schedule("1f1b", stages=3, microbatches=5, iterations=2).programs


def test_valid_lowered_with_width_and_iterations() -> None:
    s = build(2, 8, 2, width=2, iterations=2)
    validate(s)
    lowered = lower(s)
    validate(lowered)
    for program in s.programs:
        assert [a.version for a in program if a.op is Op.STEP] == [1, 1, 2, 2]
        for a in program:
            if a.is_compute:
                assert a.version == a.microbatch // 8
    assert get_info("interleaved-zb").layout(Shape(stages=2, microbatches=8, chunks=2, width=2)) \
        == s.layout


def test_rejects_microbatches_not_a_multiple_of_stages_and_replicas() -> None:
    with pytest.raises(ValueError, match=r"M=6.*P=4.*use M=8"):
        build(4, 6, 2)
    with pytest.raises(ValueError, match=r"microbatches >= 4"):
        build(4, 2, 2)
    build_schedule("interleaved-zb", stages=4, microbatches=6)  # one chunk: any M
    with pytest.raises(ValueError, match=r"replicas"):
        interleaved_zb(Shape(stages=2, microbatches=2, chunks=2, replicas=(1, 2)))
