"""The simulator against closed forms, an independent longest-path oracle, and deadlocks.

Closed forms for uniform costs (forward F, backward B, P stages, M micro-batches)::

    GPipe, 1F1B      iteration time (M+P-1)(F+B)       bubble (P-1)/(M+P-1)
    GPipe, comm C    (M+P-1)(F+B) + 2(P-1)C

Derivation of the GPipe one with communication: the forward of micro-batch j starts on stage
s at s(F+C) + jF (nothing stalls: stage s-1 finishes it C before stage s needs it), so the
last stage ends its forwards at (P-1)(F+C) + MF and starts the backwards at once; the
backward of micro-batch j starts on stage s at (P-1)(F+C) + MF + (P-1-s)(B+C) + jB, and
stage 0 ends its last backward at (P-1)(F+C) + MF + (P-1)(B+C) + MB
= (M+P-1)(F+B) + 2(P-1)C.
"""

from __future__ import annotations

import itertools

import pytest

from pipeweave.ir import Action, Layout, Op, Schedule, ScheduleError, lower, parse_action
from pipeweave.ir.deps import collective_key, dependencies
from pipeweave.ir.walk import index_actions
from pipeweave.schedules import available_schedules, build_schedule
from pipeweave.sim import Costs, simulate

SYNC_CLOSED_FORM = ["gpipe", "1f1b"]
CHUNKED = {"interleaved-1f1b": 2, "wpipe": 2, "gpipe-grouped": 2}


def registered() -> list[str]:
    return [info.name for info in available_schedules()]


def build(name: str, stages: int, microbatches: int, iterations: int = 1, **kw: object) -> Schedule:
    return build_schedule(name, stages=stages, microbatches=microbatches, iterations=iterations,
                          chunks=CHUNKED.get(name, 1), **kw)


def hand_written(rows: list[str], microbatches: int, *, name: str = "hand", lowered: bool = False,
                 layout: Layout | None = None, synchronous: bool = True) -> Schedule:
    programs = tuple(tuple(parse_action(t) for t in row.split()) for row in rows)
    return Schedule(name=name, layout=layout or Layout.straight(len(rows)),
                    microbatches=microbatches, iterations=1, programs=programs,
                    synchronous=synchronous, lowered=lowered)


# -- closed forms -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", SYNC_CLOSED_FORM)
@pytest.mark.parametrize(("p", "m"), [(1, 1), (2, 2), (3, 5), (4, 8), (5, 3), (8, 16)])
@pytest.mark.parametrize(("f", "b"), [(1.0, 2.0), (1.5, 1.5)])
def test_iteration_time_and_bubble_closed_form(name: str, p: int, m: int, f: float, b: float) -> None:
    result = simulate(build(name, p, m), Costs.uniform(forward=f, backward=b))
    assert result.iteration_time == pytest.approx((m + p - 1) * (f + b), abs=1e-12)
    assert result.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)


@pytest.mark.parametrize("name", SYNC_CLOSED_FORM)
def test_iterations_repeat_the_same_iteration_time(name: str) -> None:
    result = simulate(build(name, 4, 6, iterations=3))
    assert result.makespan == 3 * (6 + 3) * 3.0
    assert result.iteration_time == (6 + 3) * 3.0
    assert result.bubble_fraction == pytest.approx(3 / 9)


@pytest.mark.parametrize(("p", "m", "c"), [(2, 2, 0.5), (4, 8, 0.25), (5, 3, 1.0), (3, 7, 2.0)])
def test_gpipe_with_communication(p: int, m: int, c: float) -> None:
    f, b = 1.0, 2.0
    expected = (m + p - 1) * (f + b) + 2 * (p - 1) * c
    assert simulate(build("gpipe", p, m), Costs.uniform(f, b, c)).iteration_time == pytest.approx(expected)
    # the same transfer time derived from bytes and bandwidth
    by_bytes = Costs(boundary_bytes=c * 1e9, bandwidth=1e9)
    assert simulate(build("gpipe", p, m), by_bytes).iteration_time == pytest.approx(expected)


def test_gpipe_with_latency_and_per_boundary_transfer() -> None:
    # boundaries 0->1 and 1->2 cost 0.5 and 1.5 (plus 0.25 latency): the chain crosses each twice
    costs = Costs(comm=[0.5, 1.5], latency=0.25)
    expected = (4 + 3 - 1) * 3.0 + 2 * (0.75 + 1.75)
    assert simulate(build("gpipe", 3, 4), costs).iteration_time == pytest.approx(expected)


def test_timeline_of_gpipe_is_the_figure() -> None:
    """GPipe, P=2, M=2, F=1, B=2: the timeline of the module docstring of gpipe.py."""
    result = simulate(build("gpipe", 2, 2))
    assert result.timeline == [
        (0, "0F0@0", 0.0, 1.0), (0, "0F1@0", 1.0, 2.0), (0, "0B0@0", 5.0, 7.0),
        (0, "0B1@0", 7.0, 9.0), (0, "0U@1", 9.0, 9.0),
        (1, "1F0@0", 1.0, 2.0), (1, "1F1@0", 2.0, 3.0), (1, "1B0@0", 3.0, 5.0),
        (1, "1B1@0", 5.0, 7.0), (1, "1U@1", 7.0, 7.0),
    ]


# -- pieces, replicas, updates ------------------------------------------------------------------
def test_half_pieces_cost_half() -> None:
    """A micro-batch forwarded in two halves (AutoPipe's Slicer) overlaps the two stages."""
    schedule = hand_written(["0F0a 0F0b 0B0", "1F0a 1F0b 1B0"], microbatches=1)
    result = simulate(schedule, Costs(comm=1.0))
    times = {text: (t0, t1) for _, text, t0, t1 in result.timeline}
    assert times["0F0a"] == (0.0, 0.5)
    assert times["0F0b"] == (0.5, 1.0)
    assert times["1F0a"] == (1.0, 1.5)  # half the transfer (0.5) after 0F0a
    assert times["1F0b"] == (1.5, 2.0)
    assert times["1B0"] == (2.0, 4.0)
    assert times["0B0"] == (5.0, 7.0)  # the gradient is whole: a full transfer
    assert result.peak_activations == [1.0, 1.0]  # two halves = one micro-batch


def test_split_backward_costs_its_parts_and_the_previous_stage_waits_for_I_only() -> None:
    """I costs backward - weight_grad and W weight_grad (F=1, B=3, W=1: I=2); stage 0's I
    starts when stage 1's I ends, not its W, so the split ends one W earlier than B::

        rank0  F0 .  .  .  I0 I0 W0            rank0  F0 .  .  .  .  B0 B0 B0
        rank1  .  F0 I0 I0 W0                  rank1  .  F0 B0 B0 B0
    """
    costs = Costs(forward=1, backward=3, weight_grad=1)
    split = simulate(hand_written(["0F0 0I0 0W0", "1F0 1I0 1W0"], microbatches=1), costs)
    times = {text: (t0, t1) for _, text, t0, t1 in split.timeline}
    assert times == {"0F0": (0, 1), "1F0": (1, 2), "1I0": (2, 4), "1W0": (4, 5),
                     "0I0": (4, 6), "0W0": (6, 7)}
    assert split.busy == [4.0, 4.0] and split.bubble_fraction == pytest.approx(1 - 8 / 14)
    assert [str(a) for a in split.critical_path] == ["0F0", "1F0", "1I0", "0I0", "0W0"]
    whole = simulate(hand_written(["0F0 0B0", "1F0 1B0"], microbatches=1), costs)
    assert (split.makespan, whole.makespan) == (7.0, 8.0)


def test_an_activation_is_held_until_its_weight_gradient() -> None:
    """Stage 1 defers both W's: micro-batch 0's activation outlives its I, so two are held."""
    rows = ["0F0 0F1 0I0 0W0 0I1 0W1", "1F0 1I0 1F1 1I1 1W0 1W1"]
    assert simulate(hand_written(rows, microbatches=2)).peak_activations == [2, 2]
    rows[1] = "1F0 1I0 1W0 1F1 1I1 1W1"
    assert simulate(hand_written(rows, microbatches=2)).peak_activations == [2, 1]


def test_replicated_stage_all_reduces_together() -> None:
    schedule = build("1f1b", 2, 4, replicas=(2, 1))
    result = simulate(schedule, Costs(all_reduce=0.5, update=0.25))
    ar = [(r, t0, t1) for r, text, t0, t1 in result.timeline if "AR" in text]
    assert len(ar) == 2 and ar[0][1:] == ar[1][1:]  # both replicas, same interval
    start = ar[0][1]
    assert start == max(t1 for r, text, _, t1 in result.timeline if r in (0, 1) and "B" in text)
    updates = [(t0, t1) for _, text, t0, t1 in result.timeline if text.startswith("0U")]
    assert updates == [(start + 0.5, start + 0.75)] * 2


# -- lowering is equivalent; an independent oracle -----------------------------------------------
def longest_path_oracle(schedule: Schedule, costs: Costs) -> dict[tuple[int, int], float]:
    """Start times by fixed-point relaxation over program order + dependencies + collectives."""
    table = costs.resolve(schedule.num_stages)
    index = index_actions(schedule)
    groups: dict[object, list[tuple[int, int]]] = {}
    for r, p, a in schedule.actions():
        if collective_key(a) is not None:
            groups.setdefault(collective_key(a), []).append((r, p))

    def duration(a: Action) -> float:
        per_op = {Op.FORWARD: table.forward, Op.BACKWARD: table.backward, Op.STEP: table.update,
                  Op.ALL_REDUCE: table.all_reduce, Op.AVERAGE: table.average,
                  Op.BACKWARD_WEIGHT: table.weight_grad,
                  Op.BACKWARD_INPUT: tuple(b - w for b, w in zip(table.backward, table.weight_grad))}
        t = per_op[a.op][a.stage] if a.op in per_op else 0.0
        return t / 2 if a.piece else t

    start = {(r, p): 0.0 for r, p, _ in schedule.actions()}
    changed = True
    while changed:
        changed = False
        for r, p, a in schedule.actions():
            preds = [(r, p - 1, 0.0)] if p else []
            if a.op is Op.ALL_REDUCE:
                preds = [(r2, p2 - 1, 0.0) for r2, p2 in groups[collective_key(a)] if p2]
            for dep in dependencies(a, schedule.layout, lowered=schedule.lowered):
                r2, p2 = index[dep]
                d = schedule.programs[r2][p2]
                delay = table.comm(min(d.stage, a.stage), bool(d.piece)) if r2 != r else 0.0
                preds.append((r2, p2, delay))
            t = max((start[(r2, p2)] + duration(schedule.programs[r2][p2]) + delay
                     for r2, p2, delay in preds), default=0.0)
            if t > start[(r, p)]:
                start[(r, p)] = t
                changed = True
    return start


def every_schedule_small() -> list[tuple[str, Schedule]]:
    cases = []
    for name in registered():
        for p, m, k in [(3, 4, 2), (4, 8, 1)]:
            try:
                cases.append((f"{name}-P{p}M{m}K{k}", build(name, p, m, iterations=k)))
            except ValueError:
                continue
    cases.append(("1f1b-replicas", build("1f1b", 3, 4, replicas=(2, 1, 1))))
    cases.append(("gpipe-width2", build("gpipe", 2, 4, width=2)))
    if "avgpipe" in registered():
        cases.append(("avgpipe-N2", build("avgpipe", 3, 4, iterations=2, pipelines=2, advance=1)))
    return cases


def costs_for(schedule: Schedule) -> Costs:
    """Uneven per-stage costs, with communication, updates, all-reduces and averaging."""
    stages = range(schedule.num_stages)
    return Costs(forward=[1.0 + 0.5 * (s % 3) for s in stages],
                 backward=[2.0 + 0.25 * (s % 2) for s in stages],
                 weight_grad=[0.75 + 0.5 * (s % 2) for s in stages],
                 comm=0.3, update=0.1, all_reduce=0.2, average=0.15)


CASES = every_schedule_small()


@pytest.mark.parametrize(("label", "schedule"), CASES, ids=[label for label, _ in CASES])
def test_simulation_matches_oracle_and_lowered_schedule(label: str, schedule: Schedule) -> None:
    costs = costs_for(schedule)
    result = simulate(schedule, costs)
    oracle = longest_path_oracle(schedule, costs)
    for r, program in enumerate(schedule.programs):
        for p in range(len(program)):
            assert result.start[r][p] == pytest.approx(oracle[(r, p)]), (label, program[p])
    # walking the lowered schedule (explicit sends/receives) gives the same compute times
    lowered = simulate(lower(schedule), costs)
    compute = {text: (t0, t1) for _, text, t0, t1 in result.timeline}
    for _, text, t0, t1 in lowered.timeline:
        if text in compute:
            assert (t0, t1) == pytest.approx(compute[text]), (label, text)
    assert lowered.iteration_time == pytest.approx(result.iteration_time)


# -- deadlock -----------------------------------------------------------------------------------
def test_deadlock_reports_the_marked_grid() -> None:
    """Two ranks that each start by receiving from the other can never start."""
    schedule = hand_written(["0RB0 0F0 0SF0 0B0", "1RF0 1F0 1B0 1SB0"], microbatches=1,
                            name="receive-first", lowered=True)
    with pytest.raises(ScheduleError) as caught:
        simulate(schedule)
    message = str(caught.value)
    assert "'receive-first' deadlocks" in message
    assert "rank 0 at step 0 (0RB0)" in message and "rank 1 at step 0 (1RF0)" in message
    grid = message.splitlines()[-3:]
    assert grid[0].split()[:3] == ["step", "0", "1"]
    assert grid[1].split() == ["rank0", ">0RB0<", "0F0", "0SF0", "0B0"]
    assert grid[2].split() == ["rank1", ">1RF0<", "1F0", "1B0", "1SB0"]


def test_compute_only_deadlock_is_reported_too() -> None:
    schedule = hand_written(["0B0 0F0", "1F0 1B0"], microbatches=1)
    with pytest.raises(ScheduleError, match=r">0B0<(.|\n)*>1F0<"):
        simulate(schedule)


def test_missing_producer_is_an_error() -> None:
    schedule = hand_written(["0F0 0B0", "1F0 1F1 1B0 1B1"], microbatches=2)
    with pytest.raises(ScheduleError, match="1F1 depends on 0F1, which no rank schedules"):
        simulate(schedule)


def test_duplicate_action_is_an_error() -> None:
    schedule = hand_written(["0F0 0F0 0B0", "1F0 1B0"], microbatches=1)
    with pytest.raises(ScheduleError, match=r"0F0 appears twice, at rank 0 step 0 and rank 0 step 1"):
        simulate(schedule)


def test_garbage_collector_state_is_restored() -> None:
    import gc

    assert gc.isenabled()
    simulate(build("1f1b", 2, 2))
    assert gc.isenabled()
    gc.disable()
    try:
        simulate(build("1f1b", 2, 2))
        assert not gc.isenabled()
    finally:
        gc.enable()


# -- scale --------------------------------------------------------------------------------------
def test_large_schedule_keeps_the_closed_form() -> None:
    """16 stages x 128 micro-batches (4k actions); speed is benchmarks/simulate_scale.py's job."""
    result = simulate(build("1f1b", 16, 128))
    assert result.iteration_time == (128 + 15) * 3.0
    assert result.bubble_fraction == pytest.approx(15 / 143)


def test_combinations_of_small_shapes_agree_with_closed_form() -> None:
    for p, m in itertools.product(range(1, 6), range(1, 7)):
        result = simulate(build("1f1b", p, m))
        assert result.iteration_time == (m + p - 1) * 3.0
