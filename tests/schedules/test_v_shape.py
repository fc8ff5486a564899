"""V-shape schedules: the V layout, zbv, v-half and v-min.

Timelines are written like the papers' figures: one row per rank, one column per unit step
(every pass ``F``, ``I``, ``W`` costs 1, messages are free), ``.`` where the rank idles.
Memory is counted here, from the programs, not by the simulator: a chunk activation is alive
from its ``F`` to its ``W`` (or ``B`` when a backward is not split); two are one stage unit.
"""

from __future__ import annotations

import pytest

from pipeweave.ir import Action, Layout, Op, Schedule, lower, validate, walk
from pipeweave.schedules import Shape, build_schedule, get_info
from pipeweave.schedules.v_blocks import building_block
from unit_timeline import held, timeline, unit

V_SCHEDULES = ["zbv", "v-half", "v-min"]


def build(name: str, stages: int, microbatches: int, **kw: object) -> Schedule:
    return build_schedule(name, stages=stages, microbatches=microbatches, chunks=2, **kw)


def peaks(schedule: Schedule) -> list[int]:
    return [held(program) for program in schedule.programs]


def makespan(schedule: Schedule) -> int:
    return int(walk(schedule, unit).makespan)


# -- the V layout --------------------------------------------------------------------------------
def test_v_layout_puts_stages_r_and_2p_minus_1_minus_r_on_rank_r() -> None:
    layout = Layout.v_shape(3)
    assert layout.stage_ranks == ((0,), (1,), (2,), (2,), (1,), (0,))
    assert [layout.stages_of(r) for r in range(3)] == [(0, 5), (1, 4), (2, 3)]
    assert Layout.v_shape(1).stage_ranks == ((0,), (0,))
    # data-parallel copies: micro-batch j runs on copy j % 2
    assert Layout.v_shape(2, width=2).stage_ranks == ((0, 2), (1, 3), (1, 3), (0, 2))


def test_shape_asks_for_the_v_and_the_registry_names_it() -> None:
    shape = Shape(stages=3, microbatches=6, chunks=2)
    assert shape.layout("v") == Layout.v_shape(3)
    assert shape.layout() == Layout.chunked(3, 2)
    for name in V_SCHEDULES:
        info = get_info(name)
        assert info.placement == "v" and info.default_chunks == 2 and info.synchronous
        assert info.layout(shape) == build(name, 3, 6).layout == Layout.v_shape(3)
        assert info.layout(Shape(stages=3, microbatches=6)) == Layout.straight(3)
    assert get_info("interleaved-1f1b").placement == "loop"
    with pytest.raises(ValueError, match=r"exactly two chunks .* got chunks=3; use chunks=2"):
        Shape(stages=3, microbatches=6, chunks=3).layout("v")
    with pytest.raises(ValueError, match=r"unknown placement 'w'"):
        shape.layout("w")


@pytest.mark.parametrize("name", V_SCHEDULES)
def test_nothing_is_sent_at_the_bottom_of_the_v_and_the_loss_is_on_rank_0(name: str) -> None:
    P = 3
    lowered = lower(build(name, P, 6))
    sent = {(a.op, a.stage) for _, _, a in lowered.actions() if a.is_comm}
    # stage P-1 feeds stage P on the same rank, and P's gradient goes back the same way
    assert (Op.SEND_ACT, P - 1) not in sent and (Op.SEND_GRAD, P) not in sent
    assert (Op.SEND_ACT, P - 2) in sent and (Op.SEND_GRAD, P + 1) in sent
    assert lowered.layout.stages_of(0) == (0, 2 * P - 1)


# -- zbv --------------------------------------------------------------------------------------------
def test_zbv_literal_two_ranks() -> None:
    # the module docstring's figure: iteration time 25 = 6M + P - 1, no rank above 4 = 2P
    s = build("zbv", 2, 4)
    assert timeline(s) == [
        "0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 0I0 0W0 0I1 0W1 0F3 3F2 3I2 3W1 3W2 .   3F3 3I3 0I2 0W2 0I3 0W3 3W3",
        ".   1F0 2F0 1F1 2F1 2I0 1I0 1W0 2I1 1I1 2W0 1F2 2F2 1W1 2W1 2I2 1F3 2F3 1I2 1W2 2I3 1I3 2W2 1W3 2W3",
    ]
    assert peaks(s) == [4, 4]


def test_zbv_literal_four_ranks() -> None:
    # P=4, M=4 (stages 0..7 on ranks 0 1 2 3 3 2 1 0): rank 0 runs four chunk-0 forwards, then
    # waits for the first micro-batch to come back up the V; iteration time 27 = 6M + P - 1
    s = build("zbv", 4, 4)
    assert timeline(s) == [
        "0F0 0F1 0F2 0F3 .   .   .   7F0 7I0 7F1 7I1 7F2 7I2 7F3 7I3 0I0 0W0 0I1 7W0 0I2 0W1 0I3 7W1 0W2 7W2 0W3 7W3",
        ".   1F0 1F1 1F2 1F3 .   6F0 .   6F1 6I0 6F2 6I1 6F3 6I2 1I0 6I3 1I1 1W0 1I2 6W0 1I3 1W1 6W1 1W2 6W2 1W3 6W3",
        ".   .   2F0 2F1 2F2 5F0 2F3 5F1 .   5F2 5I0 5F3 5I1 2I0 5I2 2I1 5I3 2I2 2W0 2I3 5W0 2W1 5W1 2W2 5W2 2W3 5W3",
        ".   .   .   3F0 4F0 3F1 4F1 3F2 4F2 3F3 4F3 4I0 3I0 4I1 3I1 4I2 3I2 4I3 3I3 3W0 4W0 3W1 4W1 3W2 4W2 3W3 4W3",
    ]
    assert peaks(s) == [8, 8, 8, 8]


@pytest.mark.parametrize("stages", [1, 2, 3, 4, 5, 6])
def test_zbv_holds_1f1b_peak_memory(stages: int) -> None:
    # 1F1B's first rank holds P stage units = 2P chunk activations; zbv never holds more, on
    # any rank, and holds exactly that once M >= P
    for microbatches in range(1, 3 * stages + 2):
        got = peaks(build("zbv", stages, microbatches))
        assert max(got) <= 2 * stages, (stages, microbatches, got)
        if microbatches >= stages:
            assert got == [2 * stages] * stages, (stages, microbatches, got)


@pytest.mark.parametrize("stages", [1, 2, 3, 4, 5, 6, 7, 8])
def test_zbv_steady_state_has_no_bubble(stages: int) -> None:
    # rank P-1 starts at step P-1 and has 6M passes: 6M + P - 1 is a lower bound; zbv stays
    # within P - 2 of it whatever M, and meets it at M = P (and for every M >= 2P when P <= 4)
    for microbatches in range(stages, 6 * stages + 1):
        bound = 6 * microbatches + stages - 1
        got = makespan(build("zbv", stages, microbatches))
        assert bound <= got <= bound + max(0, stages - 2), (stages, microbatches, got)
        if microbatches == stages or (stages <= 4 and microbatches >= 2 * stages):
            assert got == bound, (stages, microbatches)


def test_zbv_lowering_sends_after_I_and_merges_where_nothing_is_sent() -> None:
    rank0 = " ".join(str(a.with_(version=None)) for a in lower(build("zbv", 2, 4)).programs[0])
    # stage 3 (the loss) sends its input gradient to rank 1 right after its I, then the W;
    # stage 0 sends nothing back, so an I next to its W is one B
    assert rank0.startswith("0F0 0SF0 0F1 0SF1 0F2 0SF2 3RF0 3F0 3I0 3SB0 3W0 3RF1 3F1 3I1 3SB1 "
                            "0RB0 0B0 0RB1 0B1")


# -- v-min and v-half -------------------------------------------------------------------------------
def test_building_blocks_literal() -> None:
    # one micro-batch's passes on P=4 ranks, each at the first free step modulo 6 on its rank
    # (one residue per pass: the copies of the block, 6 steps apart, never collide)
    def figure(gap: int, stages: int) -> list[str]:
        block = building_block(stages, gap)
        rows = [["."] * (max(block.values()) + 1) for _ in range(stages)]
        for (op, stage), step in block.items():
            rows[min(stage, 2 * stages - 1 - stage)][step] = f"{stage}{op.value}"
        return [" ".join(f"{c:<2}" for c in row).rstrip() for row in rows]

    assert figure(0, 4) == [  # V-Min: the tightest V
        "0F .  .  .  .  .  .  7F 7I .  7W .  .  .  .  0I .  0W",
        ".  1F .  .  .  .  6F .  .  6I 6W .  .  .  1I .  .  1W",
        ".  .  2F .  .  5F .  .  .  .  5I .  5W 2I .  2W .  .",
        ".  .  .  3F 4F .  .  .  .  .  .  4I 3I 4W 3W .  .  .",
    ]
    assert figure(1, 4) == [  # V-Half: one idle step before every chunk-1 forward
        "0F .  .  .  .  .  .  .  .  .  .  7F .  7I .  7W .  .  .  .  .  .  .  .  .  .  0I .  0W",
        ".  1F .  .  .  .  .  .  .  6F .  .  .  .  6I .  6W .  .  .  .  .  .  1I 1W .  .  .  .",
        ".  .  2F .  .  .  .  5F .  .  .  .  .  .  .  5I .  5W .  .  .  .  2I .  2W .  .  .  .",
        ".  .  .  3F .  4F .  .  .  .  .  .  .  .  .  .  4I .  3I 4W 3W .  .  .  .  .  .  .  .",
    ]
    for gap in (0, 1):
        for stages in range(1, 9):
            block = building_block(stages, gap)
            for rank in range(stages):
                mine = [t for (_, s), t in block.items() if min(s, 2 * stages - 1 - s) == rank]
                assert sorted(t % 6 for t in mine) == list(range(6))


def test_v_min_and_v_half_literal_two_ranks() -> None:
    assert timeline(build("v-min", 2, 4)) == [
        "0F0 .   .   3F0 3I0 3W0 0F1 0I0 0W0 3F1 3I1 3W1 0F2 0I1 0W1 3F2 3I2 3W2 0F3 0I2 0W2 3F3 3I3 3W3 .   0I3 0W3",
        ".   1F0 2F0 .   .   2I0 1I0 1F1 2F1 2W0 1W0 2I1 1I1 1F2 2F2 2W1 1W1 2I2 1I2 1F3 2F3 2W2 1W2 2I3 1I3 2W3 1W3",
    ]
    assert timeline(build("v-half", 2, 4)) == [
        "0F0 .   .   3F0 0F1 3I0 3W0 .   3F1 0F2 3I1 0I0 3W1 0W0 3F2 0F3 3I2 0I1 3W2 0W1 3F3 3I3 0I2 3W3 0W2 0I3 0W3",
        ".   1F0 2F0 .   .   1F1 2I0 2F1 1I0 2W0 1W0 1F2 2I1 2F2 1I1 2W1 1W1 1F3 2I2 2F3 1I2 2W2 1W2 2I3 1I3 2W3 1W3",
    ]


def test_v_min_and_v_half_literal_three_ranks() -> None:
    assert timeline(build("v-min", 3, 3)) == [
        "0F0 .   .   .   .   5F0 0F1 5I0 5W0 .   .   5F1 0F2 5I1 0I0 5W1 0W0 5F2 5I2 0I1 5W2 0W1 .   0I2 0W2",
        ".   1F0 .   .   4F0 .   .   1F1 4I0 4W0 4F1 .   1I0 1F2 4I1 4W1 4F2 1W0 1I1 4I2 4W2 1W1 1I2 1W2 .",
        ".   .   2F0 3F0 .   .   .   .   2F1 3F1 3I0 2I0 3W0 2W0 2F2 3F2 3I1 2I1 3W1 2W1 3I2 2I2 3W2 2W2 .",
    ]
    assert timeline(build("v-half", 3, 3)) == [
        "0F0 0F1 .   .   .   5F0 5I0 5W0 0F2 .   5F1 5I1 0I0 5W1 0W0 .   5F2 5I2 0I1 5W2 0W1 .   0I2 0W2",
        ".   1F0 .   .   4F0 1F1 .   4I0 4W0 4F1 1F2 1I0 1W0 4I1 4W1 4F2 1I1 1W1 4I2 4W2 .   1I2 1W2 .",
        ".   .   2F0 3F0 .   .   2F1 3F1 3I0 2I0 3W0 2F2 2W0 3F2 3I1 2I1 3W1 2W1 .   3I2 2I2 3W2 2W2 .",
    ]


def v_min_units(stages: int) -> int:
    return (stages + 4) // 3  # the paper's V-Min count, in stage units


def v_half_units(stages: int) -> int:
    return (stages + 2) // 2  # the paper's V-Half count, in stage units


@pytest.mark.parametrize("name,units", [("v-min", v_min_units), ("v-half", v_half_units)])
@pytest.mark.parametrize("stages", [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16])
def test_memory_rule_by_counting(name: str, units, stages: int) -> None:  # type: ignore[no-untyped-def]
    # no rank ever holds more than the paper's count (two chunk activations per stage unit),
    # and the fullest rank holds exactly that in the steady state
    cap = 2 * units(stages)
    for microbatches in (1, 2, stages, 2 * stages + 1, 4 * stages):
        got = peaks(build(name, stages, microbatches))
        assert max(got) <= cap, (name, stages, microbatches, got)
    assert max(peaks(build(name, stages, 4 * stages))) == cap
    assert cap <= 2 * stages  # never above 1F1B's P stage units


def test_memory_per_rank_literal() -> None:
    # the V balances memory over the ranks (1F1B holds P - r on rank r)
    assert peaks(build("v-min", 5, 20)) == [4, 6, 6, 4, 6]  # floor(9/3) = 3 stage units
    assert peaks(build("v-min", 8, 32)) == [6, 8, 8, 6, 8, 8, 6, 8]  # floor(12/3) = 4
    assert peaks(build("v-half", 4, 16)) == [6, 6, 6, 6]  # floor(6/2) = 3
    assert peaks(build("v-half", 6, 24)) == [8] * 6  # floor(8/2) = 4
    assert peaks(build_schedule("1f1b", stages=4, microbatches=16)) == [4, 3, 2, 1]  # whole stages


@pytest.mark.parametrize("stages", [2, 3, 4, 5, 6, 7, 8])
def test_blocks_steady_state_has_no_bubble_and_less_fill_than_1f1b(stages: int) -> None:
    # past M = P every extra micro-batch adds exactly its 6 passes: the fill is constant, and
    # smaller than 1F1B's 6(P-1) (a full stage's F + B is six chunk passes); V-Half's is the
    # closed form 2P - 1 + floor((5P - 6)/2) and never above V-Min's
    fill = {}
    for name in ("v-min", "v-half"):
        fills = {makespan(build(name, stages, m)) - 6 * m for m in range(stages + 1, 4 * stages)}
        assert len(fills) == 1, (name, stages, fills)
        fill[name] = fills.pop()
        assert fill[name] < 6 * (stages - 1)
    assert fill["v-half"] == stages - 1 + (5 * stages - 6) // 2
    assert fill["v-half"] <= fill["v-min"]
    assert fill["v-min"] == stages - 1 + [2, 5, 8, 11, 16, 17, 20][stages - 2]


# -- common to the three ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", V_SCHEDULES)
def test_every_backward_is_split_and_valid_lowered_or_not(name: str) -> None:
    for stages, microbatches in [(1, 3), (2, 5), (3, 4), (4, 8)]:
        s = build(name, stages, microbatches)
        ops = {a.op for _, _, a in s.actions() if a.is_compute}
        assert ops == {Op.FORWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT}
        validate(s)
        validate(lower(s))


@pytest.mark.parametrize("name", V_SCHEDULES)
def test_versions_follow_iterations_and_updates_close_each(name: str) -> None:
    s = build(name, 2, 4, iterations=3)
    for program in s.programs:
        for a in program:
            if a.is_compute:
                assert a.version == a.microbatch // 4
        assert [a.version for a in program if a.op is Op.STEP] == [1, 1, 2, 2, 3, 3]
    validate(lower(s))
    # every iteration is the same order: iteration 1 is iteration 0 with micro-batches + 4
    first = [a for a in s.programs[0] if a.is_compute and a.version == 0]
    second = [a for a in s.programs[0] if a.is_compute and a.version == 1]
    assert [a.with_(microbatch=a.microbatch + 4, version=1) for a in first] == second


@pytest.mark.parametrize("name", V_SCHEDULES)
def test_width_copies_the_v_and_all_reduces_before_each_update(name: str) -> None:
    s = build(name, 2, 8, width=2)
    assert s.layout == Layout.v_shape(2, width=2) and s.num_ranks == 4
    for program in s.programs:
        tail = [str(a) for a in program if not a.is_compute]
        assert len(tail) == 4 and tail[0].endswith("AR@1") and tail[1].endswith("U@1")
    validate(lower(s))
    # each copy runs the one-copy order on its own micro-batches (even / odd)
    alone = build(name, 2, 4)
    copy1 = [a for a in s.programs[3] if a.is_compute]
    assert [str(a.with_(microbatch=a.microbatch // 2)) for a in copy1] == [
        str(a) for a in alone.programs[1] if a.is_compute]


@pytest.mark.parametrize("name", V_SCHEDULES)
def test_one_chunk_is_plain_1f1b(name: str) -> None:
    s = build_schedule(name, stages=3, microbatches=5, iterations=2)
    ref = build_schedule("1f1b", stages=3, microbatches=5, iterations=2)
    assert s.programs == ref.programs and s.layout == ref.layout and s.name == name


@pytest.mark.parametrize("name", V_SCHEDULES)
def test_rejects_other_chunk_counts_and_replicas(name: str) -> None:
    with pytest.raises(ValueError, match=r"exactly two chunks .* got chunks=3; use chunks=2"):
        build_schedule(name, stages=2, microbatches=4, chunks=3)
    with pytest.raises(ValueError, match=r"replicas"):
        get_info(name).generate(Shape(stages=2, microbatches=4, chunks=2, replicas=(1, 2)))
