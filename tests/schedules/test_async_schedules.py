"""The asynchronous schedules: PipeDream (1F1B-RR, stashing, vertical sync), 2BW, PipeOptim, SpecTrain.

Literal schedules are written rank by rank like the papers' timelines (whitespace only aligns
them); properties are checked by walking the programs, independently of the generators.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest

from pipeweave.ir import Action, Op, Schedule, lower, validate, walk
from pipeweave.schedules import Shape, build_schedule, get_info
from pipeweave.schedules.pipeoptim import pipeoptim
from pipeweave.schedules.two_bw import two_bw

ASYNC = ["pipedream", "2bw", "pipeoptim", "spectrain"]


# -- helpers ----------------------------------------------------------------------------------
def rows(schedule: Schedule) -> list[list[str]]:
    return [[str(a) for a in program] for program in schedule.programs]


def literal(text: str) -> list[list[str]]:
    """Grid text -> tokens per rank (``rankN`` labels and alignment spaces are dropped)."""
    lines = [line.split() for line in text.strip().splitlines()]
    return [[t for t in line if not t.startswith("rank")] for line in lines]


def straight_cases(name: str) -> list[tuple[int, int, int]]:
    return [(p, m, k) for p in range(1, 6) for m in range(1, 9) for k in range(1, 4)
            if name != "2bw" or m >= p]


def peak_versions(schedule: Schedule) -> list[int]:
    """Per rank, the most weight versions held at once: the latest, plus every older version
    the backward of an in-flight micro-batch still needs (a stash)."""
    peaks = []
    for program in schedule.programs:
        needs = {a.microbatch: a.version for a in program if a.op is Op.BACKWARD}
        latest, in_flight, peak = 0, set(), 0
        for action in program:
            if action.op is Op.STEP:
                latest += 1
            elif action.op is Op.FORWARD:
                in_flight.add(action.microbatch)
            elif action.op is Op.BACKWARD:
                in_flight.discard(action.microbatch)
            held = {latest} | {needs[j] for j in in_flight if needs[j] < latest}
            peak = max(peak, len(held))
        peaks.append(peak)
    return peaks


def updates_before(program: tuple[Action, ...], position: int) -> int:
    return sum(1 for a in program[:position] if a.op is Op.STEP)


def locate(schedule: Schedule) -> dict[tuple[Op, int, int], tuple[int, int, Action]]:
    found = {}
    for rank, program in enumerate(schedule.programs):
        for position, a in enumerate(program):
            if a.is_compute:
                found[(a.op, a.stage, a.microbatch)] = (rank, position, a)
    return found


def unit_cost(_rank: int, action: Action) -> float:
    return {Op.FORWARD: 1.0, Op.BACKWARD: 2.0}.get(action.op, 0.0)


# -- registry ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ASYNC)
def test_registered_as_asynchronous_with_paper(name: str) -> None:
    info = get_info(name)
    assert info.description and info.paper and not info.synchronous
    assert not build_schedule(name, stages=2, microbatches=2).synchronous


# -- every shape: valid, lowered valid, complete ------------------------------------------------
@pytest.mark.parametrize("name", ASYNC)
def test_grid_valid_lowered_and_complete(name: str) -> None:
    for p, m, k in straight_cases(name):
        schedule = build_schedule(name, stages=p, microbatches=m, iterations=k)
        validate(schedule)
        validate(lower(schedule))
        count = Counter((a.op, a.stage, a.microbatch) for _, _, a in schedule.actions() if a.is_compute)
        expected = {(op, s, j) for op in (Op.FORWARD, Op.BACKWARD) for s in range(p)
                    for j in range(m * k)}
        assert set(count) == expected and set(count.values()) == {1}, (p, m, k)
        steps = Counter(a.stage for _, _, a in schedule.actions() if a.op is Op.STEP)
        per_stage = k if name == "2bw" else m * k  # update period M vs 1
        assert steps == {s: per_stage for s in range(p)}, (p, m, k)


# -- literal schedules, laid out like the papers' timelines -----------------------------------
def test_pipedream_literal_p2_and_p3() -> None:
    # Update after every backward; each backward uses its forward's (stashed) version.
    assert rows(build_schedule("pipedream", stages=2, microbatches=2, iterations=2)) == literal("""
        rank0 0F0@0 0F1@0 0B0@0 0U@1 0F2@1 0B1@0 0U@2 0F3@2 0B2@1 0U@3 0B3@2 0U@4
        rank1 1F0@0 1B0@0 1U@1 1F1@1 1B1@1 1U@2 1F2@2 1B2@2 1U@3 1F3@3 1B3@3 1U@4
    """)
    # pipedream.txt Figure 4's shape: stage s admits P - s, then alternates B/F.
    assert rows(build_schedule("pipedream", stages=3, microbatches=2, iterations=2)) == literal("""
        rank0 0F0@0 0F1@0 0F2@0 0B0@0 0U@1 0F3@1 0B1@0 0U@2 0B2@0 0U@3 0B3@1 0U@4
        rank1 1F0@0 1F1@0       1B0@0 1U@1 1F2@1 1B1@0 1U@2 1F3@2 1B2@1 1U@3 1B3@2 1U@4
        rank2 2F0@0             2B0@0 2U@1 2F1@1 2B1@1 2U@2 2F2@2 2B2@2 2U@3 2F3@3 2B3@3 2U@4
    """)


def test_pipedream_vertical_sync_literal_p3() -> None:
    # Every stage runs micro-batch j at the version stage 0 gave it (pipedream.txt §3.3).
    assert rows(build_schedule("pipedream", stages=3, microbatches=2, iterations=2,
                               vertical_sync=True)) == literal("""
        rank0 0F0@0 0F1@0 0F2@0 0B0@0 0U@1 0F3@1 0B1@0 0U@2 0B2@0 0U@3 0B3@1 0U@4
        rank1 1F0@0 1F1@0       1B0@0 1U@1 1F2@0 1B1@0 1U@2 1F3@1 1B2@0 1U@3 1B3@1 1U@4
        rank2 2F0@0             2B0@0 2U@1 2F1@0 2B1@0 2U@2 2F2@0 2B2@0 2U@3 2F3@1 2B3@1 2U@4
    """)


def test_pipedream_rr_literal_2_1_and_1_2() -> None:
    # pipedream.txt Figure 8 (2-1): even micro-batches on worker 1, odd on worker 2; NOAM =
    # ceil(3 workers / 2 input replicas) = 2; replicas all-reduce before every update.
    assert rows(build_schedule("pipedream", stages=2, microbatches=4, replicas=(2, 1))) == literal("""
        rank0 0F0@0 0F2@0 0B0@0 0AR@1 0U@1 0B2@0 0AR@2 0U@2
        rank1 0F1@0 0F3@0 0B1@0 0AR@1 0U@1 0B3@0 0AR@2 0U@2
        rank2 1F0@0 1B0@0 1U@1  1F1@1 1B1@1 1U@2 1F2@2 1B2@2 1U@3 1F3@3 1B3@3 1U@4
    """)
    assert rows(build_schedule("pipedream", stages=2, microbatches=4, replicas=(1, 2))) == literal("""
        rank0 0F0@0 0F1@0 0F2@0 0B0@0 0U@1 0F3@1 0B1@0 0U@2 0B2@0 0U@3 0B3@1 0U@4
        rank1 1F0@0 1B0@0 1AR@1 1U@1 1F2@1 1B2@1 1AR@2 1U@2
        rank2 1F1@0 1B1@0 1AR@1 1U@1 1F3@1 1B3@1 1AR@2 1U@2
    """)


def test_two_bw_literal_p2_and_p3() -> None:
    # Update every M=2 backwards; batch b runs at version max(0, b-1) (wpipe.txt Figure 2d).
    assert rows(build_schedule("2bw", stages=2, microbatches=2, iterations=3)) == literal("""
        rank0 0F0@0 0F1@0 0B0@0 0F2@0 0B1@0 0U@1 0F3@0 0B2@0 0F4@1 0B3@0 0U@2 0F5@1 0B4@1 0B5@1 0U@3
        rank1 1F0@0 1B0@0 1F1@0 1B1@0 1U@1 1F2@0 1B2@0 1F3@0 1B3@0 1U@2 1F4@1 1B4@1 1F5@1 1B5@1 1U@3
    """)
    assert rows(build_schedule("2bw", stages=3, microbatches=3, iterations=3)) == literal("""
        rank0 0F0@0 0F1@0 0F2@0 0B0@0 0F3@0 0B1@0 0F4@0 0B2@0 0U@1 0F5@0 0B3@0 0F6@1 0B4@0 0F7@1 0B5@0 0U@2 0F8@1 0B6@1 0B7@1 0B8@1 0U@3
        rank1 1F0@0 1F1@0 1B0@0 1F2@0 1B1@0 1F3@0 1B2@0 1U@1 1F4@0 1B3@0 1F5@0 1B4@0 1F6@1 1B5@0 1U@2 1F7@1 1B6@1 1F8@1 1B7@1 1B8@1 1U@3
        rank2 2F0@0 2B0@0 2F1@0 2B1@0 2F2@0 2B2@0 2U@1 2F3@0 2B3@0 2F4@0 2B4@0 2F5@0 2B5@0 2U@2 2F6@1 2B6@1 2F7@1 2B7@1 2F8@1 2B8@1 2U@3
    """)


def test_pipeoptim_literal_p2_and_p3() -> None:
    # F{j}@{v}~{s}: forward at version v predicting s updates ahead; B at the current weights.
    assert rows(build_schedule("pipeoptim", stages=2, microbatches=2, iterations=2)) == literal("""
        rank0 0F0@0 0F1@0~1 0B0@0 0U@1 0F2@1~1 0B1@1 0U@2 0F3@2~1 0B2@2 0U@3 0B3@3 0U@4
        rank1 1F0@0 1B0@0   1U@1  1F1@1 1B1@1  1U@2 1F2@2   1B2@2 1U@3 1F3@3 1B3@3 1U@4
    """)
    assert rows(build_schedule("pipeoptim", stages=3, microbatches=2, iterations=2)) == literal("""
        rank0 0F0@0 0F1@0~1 0F2@0~2 0B0@0 0U@1 0F3@1~2 0B1@1 0U@2 0B2@2   0U@3 0B3@3 0U@4
        rank1 1F0@0 1F1@0~1         1B0@0 1U@1 1F2@1~1 1B1@1 1U@2 1F3@2~1 1B2@2 1U@3 1B3@3 1U@4
        rank2 2F0@0                 2B0@0 2U@1 2F1@1   2B1@1 2U@2 2F2@2   2B2@2 2U@3 2F3@3 2B3@3 2U@4
    """)


def test_spectrain_literal_p3() -> None:
    # Stage 2 predicts floor(2/2)=1 further at both passes; the last stage predicts too.
    assert rows(build_schedule("spectrain", stages=3, microbatches=2, iterations=2)) == literal("""
        rank0 0F0@0   0F1@0~1 0F2@0~2 0B0@0 0U@1 0F3@1~2 0B1@1 0U@2 0B2@2 0U@3 0B3@3 0U@4
        rank1 1F0@0   1F1@0~1         1B0@0 1U@1 1F2@1~1 1B1@1 1U@2 1F3@2~1 1B2@2 1U@3 1B3@3 1U@4
        rank2 2F0@0~1 2B0@0~1 2U@1 2F1@1~1 2B1@1~1 2U@2 2F2@2~1 2B2@2~1 2U@3 2F3@3~1 2B3@3~1 2U@4
    """)


# -- weight versions ----------------------------------------------------------------------------
def test_pipedream_versions_held_is_p_minus_s() -> None:
    """Stage s holds P - s versions at its peak (wpipe.txt §2, "N - i"); for short runs the
    closed form min(P - s, max(2, N - (P - s) + 2)) with N = M*K micro-batches."""
    for p, m, k in straight_cases("pipedream"):
        n = m * k
        peaks = peak_versions(build_schedule("pipedream", stages=p, microbatches=m, iterations=k))
        for s, peak in enumerate(peaks):
            d = p - s
            assert peak == (1 if d == 1 or n == 1 else min(d, max(2, n - d + 2))), (p, m, k, s)
            if n >= 2 * p:
                assert peak == p - s


def test_pipedream_forward_uses_latest_and_backward_its_stash() -> None:
    schedule = build_schedule("pipedream", stages=4, microbatches=5, iterations=3)
    where = locate(schedule)
    for (op, s, j), (rank, position, action) in where.items():
        if op is Op.FORWARD:
            assert action.version == updates_before(schedule.programs[rank], position)
            # closed form for a straight pipeline: max(0, j - (P - s) + 1)
            assert action.version == max(0, j - (4 - s) + 1)
            assert where[(Op.BACKWARD, s, j)][2].version == action.version


def test_two_bw_holds_at_most_two_versions_and_one_delay_term() -> None:
    for p, m, k in straight_cases("2bw"):
        schedule = build_schedule("2bw", stages=p, microbatches=m, iterations=k)
        assert max(peak_versions(schedule)) <= 2, (p, m, k)
        if k >= 3 and p >= 2:
            assert max(peak_versions(schedule)) == 2
        for _, _, a in schedule.actions():
            if a.is_compute:
                assert a.version == max(0, a.microbatch // m - 1)
    for replicas in [(2, 1), (1, 2), (2, 2)]:
        schedule = build_schedule("2bw", stages=2, microbatches=4, iterations=3, replicas=replicas)
        assert max(peak_versions(schedule)) <= 2


def test_vertical_sync_versions_equal_stage_zero() -> None:
    for p, m, k in straight_cases("pipedream"):
        schedule = build_schedule("pipedream", stages=p, microbatches=m, iterations=k,
                                  vertical_sync=True)
        where = locate(schedule)
        for (op, s, j), (rank, position, action) in where.items():
            assert action.version == where[(Op.FORWARD, 0, j)][2].version
            assert action.version <= updates_before(schedule.programs[rank], position)
    # equal replica counts (data-parallel width) keep version numbers comparable
    validate(build_schedule("pipedream", stages=3, microbatches=4, iterations=2, width=2,
                            vertical_sync=True))


@pytest.mark.parametrize("name", ["pipeoptim", "spectrain"])
def test_prediction_lookahead_is_the_update_count(name: str) -> None:
    for p, m, k in straight_cases(name):
        schedule = build_schedule(name, stages=p, microbatches=m, iterations=k)
        assert max(peak_versions(schedule)) == 1  # no stash: the backward needs no old version
        where = locate(schedule)
        for r, program in enumerate(schedule.programs):
            extra = r // 2 if name == "spectrain" else 0  # SpecTrain's backward distance
            for position, f in enumerate(program):
                if f.op is not Op.FORWARD:
                    continue
                _, b_position, b = where[(Op.BACKWARD, r, f.microbatch)]
                between = sum(1 for a in program[position:b_position] if a.op is Op.STEP)
                assert f.version == updates_before(program, position)
                assert f.lookahead == between + extra
                assert b.version == f.version + between == updates_before(program, b_position)
                assert b.lookahead == extra
                if f.microbatch >= p - r - 1:  # past the warm-up: Eq. 4, s = D - rank - 1
                    assert between == p - r - 1
                if r == p - 1 and name == "pipeoptim":
                    assert f.lookahead == 0  # the last stage does no prediction


def test_pipeoptim_lookahead_override_is_on_the_forwards() -> None:
    """``lookahead=k`` tags every forward but the last stage's ``~k``; nothing else changes."""
    for k in (0, 1, 2, 5):
        schedule = build_schedule("pipeoptim", stages=3, microbatches=3, iterations=2, lookahead=k)
        default = build_schedule("pipeoptim", stages=3, microbatches=3, iterations=2)
        for program, exact in zip(schedule.programs, default.programs):
            assert len(program) == len(exact)
            for a, e in zip(program, exact):
                if a.op is Op.FORWARD and a.stage < 2:
                    assert a == e.with_(lookahead=k), (k, a, e)
                else:
                    assert a == e, (k, a, e)
        for _, _, a in lower(schedule).actions():
            if a.op is Op.FORWARD:
                assert a.lookahead == (k if a.stage < 2 else 0)


def test_pipeoptim_lookahead_override_literal_p3() -> None:
    assert rows(build_schedule("pipeoptim", stages=3, microbatches=3, lookahead=2)) == literal("""
        rank0 0F0@0~2 0F1@0~2 0F2@0~2 0B0@0 0U@1         0B1@1 0U@2         0B2@2 0U@3
        rank1         1F0@0~2 1F1@0~2 1B0@0 1U@1 1F2@1~2 1B1@1 1U@2         1B2@2 1U@3
        rank2                 2F0@0   2B0@0 2U@1 2F1@1   2B1@1 2U@2 2F2@2   2B2@2 2U@3
    """)


@pytest.mark.parametrize("lookahead", [0, 1, 2])
def test_pipeoptim_lookahead_override_validates(lookahead: int) -> None:
    for p, m, k in [(1, 2, 2), (2, 3, 2), (3, 4, 2), (4, 2, 3)]:
        schedule = build_schedule("pipeoptim", stages=p, microbatches=m, iterations=k,
                                  lookahead=lookahead)
        validate(schedule)
        validate(lower(schedule))
    validate(build_schedule("pipeoptim", stages=2, microbatches=4, iterations=2, replicas=(2, 1),
                            lookahead=lookahead))


# -- 1F1B-RR ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["pipedream", "2bw", "pipeoptim"])
@pytest.mark.parametrize("replicas", [(2, 1), (1, 2), (2, 2), (1, 3, 2), (3, 1, 1)])
def test_replicated_routing_allreduce_and_liveness(name: str, replicas: tuple[int, ...]) -> None:
    m = math.lcm(*replicas) * 2
    shape = Shape(stages=len(replicas), microbatches=m, iterations=2, replicas=replicas)
    m = max(m, get_info(name).min_microbatches(shape))
    m = math.lcm(*replicas) * math.ceil(m / math.lcm(*replicas))
    schedule = build_schedule(name, stages=len(replicas), microbatches=m, iterations=2,
                              replicas=replicas)
    validate(schedule)
    validate(lower(schedule))
    layout = schedule.layout
    where = locate(schedule)
    for s, r_s in enumerate(replicas):
        for j in range(m * 2):
            rank = layout.stage_ranks[s][j % r_s]
            assert where[(Op.FORWARD, s, j)][0] == rank == where[(Op.BACKWARD, s, j)][0]
    workers = sum(replicas)
    for rank, program in enumerate(schedule.programs):
        (s,) = layout.stages_of(rank)
        steps = [i for i, a in enumerate(program) if a.op is Op.STEP]
        reduces = [i for i, a in enumerate(program) if a.op is Op.ALL_REDUCE]
        if replicas[s] > 1:
            assert reduces == [i - 1 for i in steps]
            assert [program[i].version for i in reduces] == list(range(1, len(steps) + 1))
        else:
            assert reduces == []
        # warm-up: ceil(workers from s on / r_s) forwards first; NOAM on the input stage
        first_b = next(i for i, a in enumerate(program) if a.op is Op.BACKWARD)
        depth = math.ceil(sum(replicas[s:]) / replicas[s])
        if s == 0:
            assert depth == math.ceil(workers / replicas[0])
        local = len([a for a in program if a.op is Op.FORWARD])
        assert sum(1 for a in program[:first_b] if a.op is Op.FORWARD) == min(depth, local)


# -- zero idle time in steady state -------------------------------------------------------------
@pytest.mark.parametrize("name", ASYNC)
def test_unit_cost_walk_has_no_steady_state_bubble(name: str) -> None:
    """F=1, B=2, no communication: between a rank's first backward and last forward, and
    across the middle iteration when M >= P, compute actions follow each other without gap."""
    for p in range(1, 6):
        for m in range(p if name == "2bw" else 1, 9):
            schedule = build_schedule(name, stages=p, microbatches=m, iterations=3)
            timed = walk(schedule, unit_cost)
            assert not timed.deadlocked
            for r, program in enumerate(schedule.programs):
                compute = [i for i, a in enumerate(program) if a.is_compute]
                gaps = [timed.start[r][b] - timed.end[r][a] for a, b in zip(compute, compute[1:])]
                first_b = next(n for n, i in enumerate(compute) if program[i].op is Op.BACKWARD)
                last_f = max(n for n, i in enumerate(compute) if program[i].op is Op.FORWARD)
                assert all(g == 0 for g in gaps[first_b:last_f]), (p, m, r)
                if m >= p:
                    middle = [n for n, i in enumerate(compute) if m <= program[i].microbatch < 2 * m]
                    assert all(g == 0 for g in gaps[min(middle):max(middle)]), (p, m, r)
            # and the steady state runs at the ideal rate: P*(F+B) per micro-batch in total
            if m >= p:
                assert timed.makespan == pytest.approx(3 * (m * 3 + p - 1))


# -- bad input -----------------------------------------------------------------------------------
def test_two_bw_rejects_fewer_microbatches_than_stages() -> None:
    with pytest.raises(ValueError, match="microbatches >= 4.*got 3"):
        build_schedule("2bw", stages=4, microbatches=3)
    with pytest.raises(ValueError, match="microbatches=3"):
        two_bw(Shape(stages=4, microbatches=3))
    assert get_info("2bw").min_microbatches(Shape(stages=4, microbatches=4)) == 4
    # replicated: M >= r_s * depth(s); (2, 1) -> stage 0 depth 2, so 4
    assert get_info("2bw").min_microbatches(Shape(stages=2, microbatches=2, replicas=(2, 1))) == 4


@pytest.mark.parametrize("name", ASYNC)
def test_unknown_option_is_named(name: str) -> None:
    with pytest.raises(ValueError, match="warmup_depth"):
        build_schedule(name, stages=2, microbatches=4, warmup_depth=3)


def test_bad_option_values_are_named() -> None:
    with pytest.raises(ValueError, match="'yes'"):
        build_schedule("pipedream", stages=2, microbatches=2, vertical_sync="yes")
    with pytest.raises(ValueError, match="-1"):
        pipeoptim(Shape(stages=2, microbatches=2, options={"lookahead": -1}))
    with pytest.raises(ValueError, match="same replica count"):
        build_schedule("pipedream", stages=2, microbatches=4, replicas=(2, 1), vertical_sync=True)
    with pytest.raises(ValueError, match="multiple of 2; got 3"):
        build_schedule("pipedream", stages=2, microbatches=3, replicas=(1, 2))
    with pytest.raises(ValueError, match=r"replicas=\(2, 1\)"):
        build_schedule("spectrain", stages=2, microbatches=4, replicas=(2, 1))
    with pytest.raises(ValueError, match="chunks=2"):
        build_schedule("pipeoptim", stages=2, microbatches=4, chunks=2)
