"""wpipe (2GW): literal order, Eq. 1's versions, G1 synchronous, Table 1 counted from the schedule."""

from __future__ import annotations

from collections import defaultdict
from fractions import Fraction

import pytest

from pipeweave.ir import Action, Layout, Op, Schedule, lower, validate, walk
from pipeweave.schedules import Shape, build_schedule
from pipeweave.schedules.wpipe import wpipe


def unit(_rank: int, action: Action) -> float:
    return 1.0 if action.is_compute else 0.0


def rows(schedule: Schedule, versions: bool = True) -> list[str]:
    def text(a: Action) -> str:
        return str(a) if versions or not a.is_compute else str(a.with_(version=None))
    return [" ".join(text(a) for a in program) for program in schedule.programs]


def live_intervals(schedule: Schedule) -> dict[int, list[tuple[float, float, int]]]:
    """Per rank, ``(start of F, end of B, stage)`` of every activation, from a unit-cost walk."""
    w = walk(schedule, unit)
    start: dict[tuple[int, int], float] = {}
    out: dict[int, list[tuple[float, float, int]]] = defaultdict(list)
    for rank, program in enumerate(schedule.programs):
        for i, a in enumerate(program):
            if a.op is Op.FORWARD:
                start[(a.stage, a.microbatch)] = w.start[rank][i]
            elif a.op is Op.BACKWARD:
                out[rank].append((start[(a.stage, a.microbatch)], w.end[rank][i], a.stage))
    return out


def snapshots(intervals: list[tuple[float, float, int]]) -> list[dict[int, int]]:
    """Activations alive per stage at every activation's start (intervals are [start, end))."""
    return [{s: sum(1 for a, b, t in intervals if t == s and a <= t0 < b)
             for s in {t for _, _, t in intervals}} for t0, _, _ in intervals]


def peak_per_rank(schedule: Schedule) -> list[int]:
    return [max(sum(snap.values()) for snap in snapshots(iv))
            for _, iv in sorted(live_intervals(schedule).items())]


def peak_per_stage(schedule: Schedule) -> dict[int, int]:
    peaks: dict[int, int] = defaultdict(int)
    for iv in live_intervals(schedule).values():
        for snap in snapshots(iv):
            for stage, n in snap.items():
                peaks[stage] = max(peaks[stage], n)
    return dict(peaks)


def versions_held(schedule: Schedule) -> dict[int, int]:
    """Most weight versions a stage holds at once: its current one plus those in-flight
    micro-batches still need for their backward (walking each rank's program in order)."""
    most: dict[int, int] = defaultdict(int)
    for program in schedule.programs:
        current: dict[int, int] = defaultdict(int)
        pending: dict[int, dict[int | None, int | None]] = defaultdict(dict)
        for a in program:
            if a.op is Op.STEP:
                current[a.stage] = a.version or 0
            elif a.op is Op.FORWARD:
                pending[a.stage][a.microbatch] = a.version
            elif a.op is Op.BACKWARD:
                del pending[a.stage][a.microbatch]
            held = {current[a.stage], *pending[a.stage].values()}
            most[a.stage] = max(most[a.stage], len(held))
    return dict(most)


def test_literal_two_ranks_like_figure_5() -> None:
    # P=2, M=2, K=2. G0 = stages 0,1; G1 = stages 2,3. The G0 forwards of period 1
    # (micro-batches 2, 3) run before the G0 backwards of period 0 and use version 0, as do
    # those backwards; G1 flushes each period on one version; updates alternate G1, G0.
    s = build_schedule("wpipe", stages=2, microbatches=2, iterations=2)
    assert rows(s) == [
        "0F0@0 0F1@0 2F0@0 2F1@0 2B0@0 0F2@0 2B1@0 2U@1 0F3@0 0B0@0 2F2@1 0B1@0 0U@1 "
        "2F3@1 2B2@1 2B3@1 2U@2 0B2@0 0B3@0 0U@2",
        "1F0@0 1F1@0 3F0@0 3B0@0 3F1@0 3B1@0 3U@1 1F2@0 1B0@0 1F3@0 1B1@0 1U@1 "
        "3F2@1 3B2@1 3F3@1 3B3@1 3U@2 1B2@0 1B3@0 1U@2",
    ]
    # the module docstring's timeline (unit costs): one bubble per rank after warm-up
    w = walk(s, unit)
    assert [[w.start[0][i] for i, a in enumerate(s.programs[0]) if a.is_compute]] == [
        [0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 12, 13, 15, 16, 17]]


def test_literal_three_ranks() -> None:
    # P=3, M=3, K=2, worked by hand from the splice: V u occupies rank r at step 2u+r going
    # down and 2u+5-r coming up; V's 0-2 are period 0's G0 forwards, 3-5 G1 period 0,
    # 6-8 [G0 forward of period 1, G0 backward of period 0], 9-11 G1 period 1, 12-14 G0
    # backwards of period 1. Rank 0: 3B0 at step 11 precedes 0F3 at 12, etc.
    s = build_schedule("wpipe", stages=3, microbatches=3, iterations=2)
    assert rows(s, versions=False) == [
        "0F0 0F1 0F2 3F0 3F1 3F2 3B0 0F3 3B1 0F4 3B2 3U@1 0F5 0B0 3F3 0B1 3F4 0B2 0U@1 "
        "3F5 3B3 3B4 3B5 3U@2 0B3 0B4 0B5 0U@2",
        "1F0 1F1 1F2 4F0 4F1 4B0 4F2 4B1 1F3 4B2 4U@1 1F4 1B0 1F5 1B1 4F3 1B2 1U@1 "
        "4F4 4B3 4F5 4B4 4B5 4U@2 1B3 1B4 1B5 1U@2",
        "2F0 2F1 2F2 5F0 5B0 5F1 5B1 5F2 5B2 5U@1 2F3 2B0 2F4 2B1 2F5 2B2 2U@1 "
        "5F3 5B3 5F4 5B4 5F5 5B5 5U@2 2B3 2B4 2B5 2U@2",
    ]


def test_layout_is_two_groups_on_the_same_ranks() -> None:
    s = build_schedule("wpipe", stages=4, microbatches=4)
    assert s.layout == Layout.chunked(4, 2)
    assert [s.layout.stages_of(r) for r in range(4)] == [(0, 4), (1, 5), (2, 6), (3, 7)]


@pytest.mark.parametrize("stages,microbatches", [(2, 2), (2, 3), (3, 3), (4, 4), (4, 6)])
def test_weight_versions_follow_equation_1(stages: int, microbatches: int) -> None:
    # Eq. 1: w^{t+1} = w^t - lr * grad f(w^{t-1+i}) for group G_i.
    K = 4
    s = build_schedule("wpipe", stages=stages, microbatches=microbatches, iterations=K)
    for program in s.programs:
        for a in program:
            if not a.is_compute:
                continue
            period = a.microbatch // microbatches
            if a.stage >= stages:  # G1: synchronous, one version per period
                assert a.version == period, a
            else:  # G0: forward and backward one update behind
                assert a.version == max(period - 1, 0), a
    validate(s)  # every backward uses its forward's version, every version exists


@pytest.mark.parametrize("stages,microbatches", [(2, 2), (3, 3), (3, 5), (4, 4)])
def test_g1_is_synchronous_and_updates_alternate(stages: int, microbatches: int) -> None:
    K = 3
    s = build_schedule("wpipe", stages=stages, microbatches=microbatches, iterations=K)
    for rank, program in enumerate(s.programs):
        g0, g1 = rank, stages + rank
        pos = {(a.op, a.stage, a.microbatch, a.version): i for i, a in enumerate(program)}

        def where(op: Op, stage: int, period: int) -> list[int]:
            return [i for i, a in enumerate(program) if a.op is op and a.stage == stage
                    and a.microbatch // microbatches == period]

        updates = []
        for t in range(K):
            u1 = pos[(Op.STEP, g1, None, t + 1)]
            u0 = pos[(Op.STEP, g0, None, t + 1)]
            # G1: the whole period (forwards and backwards) sits between updates t and t+1
            assert max(where(Op.BACKWARD, g1, t)) < u1
            if t + 1 < K:
                assert u1 < min(where(Op.FORWARD, g1, t + 1))
            # G0: update t+1 follows period t's backwards; the next period's forwards were
            # moved in front of those backwards
            assert max(where(Op.BACKWARD, g0, t)) < u0
            if t + 1 < K:
                assert min(where(Op.FORWARD, g0, t + 1)) < max(where(Op.BACKWARD, g0, t))
                assert max(where(Op.FORWARD, g0, t + 1)) < u0
            updates += [u1, u0]
        assert updates == sorted(updates)  # G1, G0, G1, G0, ...: alternating


@pytest.mark.parametrize("stages", [2, 3, 4, 5])
@pytest.mark.parametrize("extra", [0, 2])
def test_table_1_weight_buffer(stages: int, extra: int) -> None:
    # Table 1, "the size of all buffers": S_m for WPipe. G0 stages keep 2 versions, G1 stages
    # 1 (no buffer); each stage is S_m / 2N of the model.
    s = build_schedule("wpipe", stages=stages, microbatches=stages + extra, iterations=4)
    held = versions_held(s)
    assert [held[x] for x in range(stages)] == [2] * stages
    assert [held[x] for x in range(stages, 2 * stages)] == [1] * stages
    buffer = sum(Fraction(n, 2 * stages) for n in held.values() if n > 1)
    assert buffer == 1  # x S_m
    # the same count gives 2BW-like 0 for GPipe (one version, no buffer)
    assert set(versions_held(build_schedule("gpipe", stages=stages, microbatches=stages,
                                            iterations=3)).values()) == {1}


@pytest.mark.parametrize("stages", [2, 3, 4, 5])
def test_table_1_activations_without_recomputation(stages: int) -> None:
    # Table 1 / Eq. 2 for M = N: stage_i holds M * S_a/2N for G0 plus (M - i) * S_a/2N for
    # G1, (4M - N + 1)/4 * S_a in all. Counted from a unit-cost walk of the schedule.
    N = M = stages
    s = build_schedule("wpipe", stages=N, microbatches=M, iterations=4)
    per_rank = peak_per_rank(s)
    assert per_rank == [2 * M - i for i in range(N)]
    peaks = peak_per_stage(s)
    assert [peaks[N + i] for i in range(N)] == [M - i for i in range(N)]  # G1
    for rank, iv in live_intervals(s).items():  # some instant splits it as the paper does
        assert {rank: M, N + rank: M - rank} in snapshots(iv)
    assert sum(Fraction(n, 2 * N) for n in per_rank) == Fraction(4 * M - N + 1, 4)  # x S_a
    # the same count reproduces GPipe's row, M * S_a
    gpipe = build_schedule("gpipe", stages=N, microbatches=M, iterations=2)
    assert sum(Fraction(n, N) for n in peak_per_rank(gpipe)) == M


@pytest.mark.parametrize("stages,microbatches", [(2, 4), (3, 4), (3, 7), (4, 8)])
def test_activations_for_longer_periods(stages: int, microbatches: int) -> None:
    # For M > N the count is M + N - i on rank i (Table 1's formulas are those of M = N);
    # G1 keeps 1F1B's min(N - i, M).
    s = build_schedule("wpipe", stages=stages, microbatches=microbatches, iterations=3)
    assert peak_per_rank(s) == [microbatches + stages - i for i in range(stages)]
    peaks = peak_per_stage(s)
    assert [peaks[stages + i] for i in range(stages)] == [stages - i for i in range(stages)]


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_table_1_activations_with_recomputation(stages: int) -> None:
    # With recomputation only the activation under backward is materialised: one chunk
    # (S_a / 2N) per rank at a time, 0.5 S_a in all (GPipe: one stage, S_a / N, S_a in all).
    for name, chunk, expected in (("wpipe", Fraction(1, 2 * stages), Fraction(1, 2)),
                                  ("gpipe", Fraction(1, stages), Fraction(1))):
        s = build_schedule(name, stages=stages, microbatches=stages, iterations=2)
        w = walk(s, unit)
        total = Fraction(0)
        for rank, program in enumerate(s.programs):
            spans = [(w.start[rank][i], w.end[rank][i]) for i, a in enumerate(program)
                     if a.op is Op.BACKWARD]
            active = max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans)
            total += active * chunk
        assert total == expected


@pytest.mark.parametrize("stages,microbatches", [(2, 2), (3, 3), (3, 4), (4, 4), (4, 8), (5, 6)])
def test_steady_state_has_no_bubbles(stages: int, microbatches: int) -> None:
    # After warm-up every rank alternates G0 and G1 work (Fig. 5): one more period costs
    # exactly the 4M unit actions a rank runs per period.
    spans = [walk(build_schedule("wpipe", stages=stages, microbatches=microbatches,
                                 iterations=k), unit).makespan for k in (2, 3, 4)]
    assert spans[2] - spans[1] == spans[1] - spans[0] == 4 * microbatches


def test_width_copies_the_pipeline_and_all_reduces() -> None:
    # depth 2 x width 2: micro-batch j runs on copy j % 2; each copy is the width-1 schedule
    # of its micro-batches, with AR before every update.
    s = build_schedule("wpipe", stages=2, microbatches=4, iterations=2, width=2)
    assert s.num_ranks == 4
    single = build_schedule("wpipe", stages=2, microbatches=2, iterations=2)
    for copy in range(2):
        for r in range(2):
            program = s.programs[copy * 2 + r]
            compute = [a for a in program if a.is_compute]
            expected = [a.with_(microbatch=2 * a.microbatch + copy)
                        for a in single.programs[r] if a.is_compute]
            assert compute == expected
            steps = [str(a) for a in program if not a.is_compute]
            assert steps == [x for v in (1, 2) for stage in (2 + r, r)
                             for x in (f"{stage}AR@{v}", f"{stage}U@{v}")]
    validate(s)
    validate(lower(s))


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
@pytest.mark.parametrize("extra", [0, 1, 3])
@pytest.mark.parametrize("iterations", [1, 2, 3])
@pytest.mark.parametrize("width", [1, 2])
def test_validator_accepts(stages: int, extra: int, iterations: int, width: int) -> None:
    s = build_schedule("wpipe", stages=stages, microbatches=(stages + extra) * width,
                       iterations=iterations, width=width)
    validate(s)
    validate(lower(s))


def test_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match=r"microbatches >= 4"):
        build_schedule("wpipe", stages=4, microbatches=3)
    with pytest.raises(ValueError, match=r"M=3.*P=4"):
        wpipe(Shape(stages=4, microbatches=3))
    with pytest.raises(ValueError, match=r"M=5.*width \(2\)"):
        build_schedule("wpipe", stages=2, microbatches=5, width=2)
    with pytest.raises(ValueError, match=r"chunks=3; omit chunks or set it to 2"):
        build_schedule("wpipe", stages=2, microbatches=2, chunks=3)
    with pytest.raises(ValueError, match=r"replicas"):
        wpipe(Shape(stages=2, microbatches=2, replicas=(1, 2)))
    assert build_schedule("wpipe", stages=2, microbatches=2, chunks=2).num_stages == 4
