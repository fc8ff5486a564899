"""zb-h1 and zb-h2: literal orders, the paper's Figure 3 at unit costs, held activations,
lowering (a W right after its I merges into B) and the shapes they accept.

Figures are unit-cost timelines (F = I = W = 1, B = I + W = 2): one column per time unit,
``.`` where the rank idles, as in Qi et al. (ICLR 2024), Figure 3.
"""

from __future__ import annotations

import pytest

from pipeweave.ir import Action, Op, Schedule, lower, validate, walk
from pipeweave.schedules import build_schedule, get_info
from pipeweave.schedules.zero_bubble import split_order, zb_h1_order, zb_h2_order
from pipeweave.sim import simulate


def rows(schedule: Schedule) -> list[str]:
    """Each rank's program as text, compute actions without their (per-iteration) version."""
    def text(a: Action) -> str:
        return str(a.with_(version=None)) if a.is_compute else str(a)
    return [" ".join(text(a) for a in program) for program in schedule.programs]


def figure(schedule: Schedule) -> list[str]:
    """The unit-cost timeline: per rank, one cell per time unit (``.`` idle), stage left out."""
    timed = walk(schedule, lambda _rank, a: 1.0 if a.is_compute else 0.0)
    lines = []
    for rank, program in enumerate(schedule.programs):
        cells = ["."] * int(timed.makespan)
        for action, t0 in zip(program, timed.start[rank]):
            if action.is_compute:
                cells[int(t0)] = f"{action.op.value}{action.microbatch}"
        lines.append(f"rank{rank}  " + " ".join(f"{c:<2}" for c in cells).rstrip())
    return lines


def test_zb_h1_literal_three_stages() -> None:
    # warm-up P-1-i forwards as 1F1B, then per micro-batch k: F, I_k, W_{k-i}; stage i owes
    # i weight gradients at the end, so each stage holds 3 = P activations at its peak.
    s = build_schedule("zb-h1", stages=3, microbatches=4)
    assert rows(s) == [
        "0F0 0F1 0F2 0I0 0W0 0F3 0I1 0W1 0I2 0W2 0I3 0W3 0U@1",
        "1F0 1F1 1I0 1F2 1I1 1W0 1F3 1I2 1W1 1I3 1W2 1W3 1U@1",
        "2F0 2I0 2F1 2I1 2F2 2I2 2W0 2F3 2I3 2W1 2W2 2W3 2U@1",
    ]


def test_zb_h2_literal_three_stages() -> None:
    # warm-up 2(P-1-i) forwards (the first stage runs 2P-1 = 5 > M = 4: all of them), W's
    # deferred by 2i.
    s = build_schedule("zb-h2", stages=3, microbatches=4)
    assert rows(s) == [
        "0F0 0F1 0F2 0F3 0I0 0W0 0I1 0W1 0I2 0W2 0I3 0W3 0U@1",
        "1F0 1F1 1F2 1I0 1F3 1I1 1I2 1W0 1I3 1W1 1W2 1W3 1U@1",
        "2F0 2I0 2F1 2I1 2F2 2I2 2F3 2I3 2W0 2W1 2W2 2W3 2U@1",
    ]


def test_zb_h1_is_figure_3_top() -> None:
    # 1F1B (B = I+W = 2) takes (M+P-1)(F+B) = 33 units here; ZB-H1 27, each rank idle P-1 = 3.
    assert figure(build_schedule("zb-h1", stages=4, microbatches=8)) == [
        "rank0  F0 F1 F2 F3 .  .  .  I0 W0 F4 I1 W1 F5 I2 W2 F6 I3 W3 F7 I4 W4 I5 W5 I6 W6 I7 W7",
        "rank1  .  F0 F1 F2 .  .  I0 F3 I1 W0 F4 I2 W1 F5 I3 W2 F6 I4 W3 F7 I5 W4 I6 W5 I7 W6 W7",
        "rank2  .  .  F0 F1 .  I0 F2 I1 F3 I2 W0 F4 I3 W1 F5 I4 W2 F6 I5 W3 F7 I6 W4 I7 W5 W6 W7",
        "rank3  .  .  .  F0 I0 F1 I1 F2 I2 F3 I3 W0 F4 I4 W1 F5 I5 W2 F6 I6 W3 F7 I7 W4 W5 W6 W7",
    ]


def test_zb_h2_is_figure_3_bottom() -> None:
    # A parallelogram: rank i busy from i to i + 24 without a gap.
    assert figure(build_schedule("zb-h2", stages=4, microbatches=8)) == [
        "rank0  F0 F1 F2 F3 F4 F5 F6 I0 W0 F7 I1 W1 I2 W2 I3 W3 I4 W4 I5 W5 I6 W6 I7 W7 .  .  .",
        "rank1  .  F0 F1 F2 F3 F4 I0 F5 I1 F6 I2 W0 F7 I3 W1 I4 W2 I5 W3 I6 W4 I7 W5 W6 W7 .  .",
        "rank2  .  .  F0 F1 F2 I0 F3 I1 F4 I2 F5 I3 F6 I4 W0 F7 I5 W1 I6 W2 I7 W3 W4 W5 W6 W7 .",
        "rank3  .  .  .  F0 I0 F1 I1 F2 I2 F3 I3 F4 I4 F5 I5 F6 I6 W0 F7 I7 W1 W2 W3 W4 W5 W6 W7",
    ]


def test_the_module_docstring_shows_the_figures() -> None:
    from pipeweave.schedules import zero_bubble
    doc = " ".join((zero_bubble.__doc__ or "").split())
    for name in ("zb-h1", "zb-h2"):
        for line in figure(build_schedule(name, stages=4, microbatches=8)):
            assert " ".join(line.rstrip(" .").split()) in doc


def test_split_order_rule() -> None:
    assert [f"{op.value}{j}" for op, j in split_order([0, 1, 2, 3], warmup=1, defer=2)] == [
        "F0", "F1", "I0", "F2", "I1", "F3", "I2", "W0", "I3", "W1", "W2", "W3"]
    # defer 0 is 1F1B with every backward split in place
    assert [f"{op.value}{j}" for op, j in split_order([5, 6], warmup=0, defer=0)] == [
        "F5", "I5", "W5", "F6", "I6", "W6"]


@pytest.mark.parametrize(("name", "peak"), [("zb-h1", lambda p: p), ("zb-h2", lambda p: 2 * p - 1)])
@pytest.mark.parametrize(("p", "m"), [(1, 3), (2, 1), (2, 5), (3, 4), (4, 8), (5, 12), (6, 4)])
def test_every_stage_holds_at_most_the_papers_peak(name: str, peak, p: int, m: int) -> None:  # type: ignore[no-untyped-def]
    """ZB-H1: P micro-batches on every stage (1F1B's peak, which 1F1B reaches on the first
    stage only); ZB-H2: 2P-1. An activation counts from its F to its W; fewer micro-batches
    than that cap the count at M."""
    held = simulate(build_schedule(name, stages=p, microbatches=m)).peak_activations
    assert held == [min(peak(p), m)] * p


def test_lowering_merges_where_nothing_is_sent_between() -> None:
    # Stage 0 sends no gradient and never defers: every I W pair becomes a B. Stage 1 sends
    # the gradient right after each I and keeps its deferred W's apart.
    lowered = lower(build_schedule("zb-h1", stages=2, microbatches=3))
    validate(lowered)
    assert rows(lowered) == [
        "0F0 0SF0 0F1 0SF1 0RB0 0B0 0F2 0SF2 0RB1 0B1 0RB2 0B2 0U@1",
        "1RF0 1F0 1I0 1SB0 1RF1 1F1 1I1 1SB1 1W0 1RF2 1F2 1I2 1SB2 1W1 1W2 1U@1",
    ]


@pytest.mark.parametrize("name", ["zb-h1", "zb-h2"])
def test_one_stage_is_plain_training(name: str) -> None:
    """P = 1: F, I, W per micro-batch, which lowers to F B F B ..., 1F1B's program."""
    ours, theirs = (lower(build_schedule(n, stages=1, microbatches=3, iterations=2))
                    for n in (name, "1f1b"))
    assert ours.programs == theirs.programs


@pytest.mark.parametrize("name", ["zb-h1", "zb-h2"])
@pytest.mark.parametrize("shape", [{"width": 2}, {"replicas": (2, 1, 1)}, {"iterations": 3}])
def test_replicas_width_and_iterations_are_valid(name: str, shape: dict) -> None:  # type: ignore[type-arg]
    schedule = build_schedule(name, stages=3, microbatches=6, **shape)
    validate(schedule)
    validate(lower(schedule))
    assert schedule.synchronous and get_info(name).synchronous


@pytest.mark.parametrize("name", ["zb-h1", "zb-h2"])
def test_chunks_are_refused_with_the_fix(name: str) -> None:
    with pytest.raises(ValueError, match=f"schedule '{name}' runs one stage per rank, got "
                                         "chunks=2; use chunks=1"):
        build_schedule(name, stages=2, microbatches=4, chunks=2)


def test_orders_match_the_rule_per_stage() -> None:
    mbs = list(range(10))
    for depth in range(1, 6):
        for position in range(depth):
            assert zb_h1_order(position, depth, mbs) == split_order(
                mbs, warmup=depth - position - 1, defer=position)
            assert zb_h2_order(position, depth, mbs) == split_order(
                mbs, warmup=2 * (depth - position - 1), defer=2 * position)
            weights = [j for op, j in zb_h2_order(position, depth, mbs) if op is Op.BACKWARD_WEIGHT]
            assert weights == mbs  # W's in micro-batch order
