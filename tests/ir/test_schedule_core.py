"""Layouts, dependencies, lowering, CSV, grid and the validator on hand-written schedules."""

import pytest

from pipeweave.ir import (Layout, Schedule, ScheduleError, dependencies, lower, parse_action,
                          render_grid, schedule_from_csv, schedule_to_csv, validate)
from pipeweave.ir.deps import receiver
from pipeweave.schedules import build_schedule


def make(rows: list[str], layout: Layout | None = None, **fields) -> Schedule:
    programs = tuple(tuple(parse_action(t) for t in row.split()) for row in rows)
    layout = layout or Layout.straight(len(rows))
    defaults = dict(name="hand", layout=layout, microbatches=2, iterations=1)
    return Schedule(programs=programs, **{**defaults, **fields})


def test_layouts() -> None:
    assert Layout.chunked(2, 2).stage_ranks == ((0,), (1,), (0,), (1,))
    assert Layout.replicated([2, 1]).stage_ranks == ((0, 1), (2,))
    assert Layout.data_parallel(2, 2).stage_ranks == ((0, 2), (1, 3))
    layout = Layout.replicated([2, 1])
    assert [layout.rank_of(0, j) for j in range(4)] == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="without gaps"):
        Layout(((0,), (2,)))


def test_dependencies_lowered_and_not() -> None:
    layout = Layout.straight(2)
    f1 = parse_action("1F0@0")
    assert dependencies(f1, layout) == (parse_action("0F0"),)
    assert dependencies(f1, layout, lowered=True) == (parse_action("1RF0"),)
    assert dependencies(parse_action("1RF0"), layout, lowered=True) == (parse_action("0SF0"),)
    assert dependencies(parse_action("0B0"), layout) == (parse_action("1B0"),)
    assert dependencies(parse_action("1B0"), layout) == ()
    assert receiver(parse_action("0SF0"), layout) == (parse_action("1RF0"), 1)
    # chunks: stage 1 -> 2 stays on... stage 2 is on rank 0 again (P=2): cross-rank
    chunked = Layout.chunked(1, 2)
    assert dependencies(parse_action("1F0"), chunked, lowered=True) == (parse_action("0F0"),)


def test_lowering_1f1b_literal() -> None:
    lowered = lower(build_schedule("1f1b", stages=2, microbatches=2))
    assert [" ".join(str(a) for a in p) for p in lowered.programs] == [
        "0F0@0 0SF0 0F1@0 0SF1 0RB0 0B0@0 0RB1 0B1@0 0U@1",
        "1RF0 1F0@0 1B0@0 1SB0 1RF1 1F1@0 1B1@0 1SB1 1U@1",
    ]
    validate(lowered)


def test_csv_round_trip(tmp_path) -> None:
    schedule = lower(build_schedule("gpipe", stages=3, microbatches=4, iterations=2))
    text = schedule_to_csv(schedule, tmp_path / "s.csv")
    assert (tmp_path / "s.csv").read_text() == text
    assert schedule_from_csv(text, template=schedule).programs == schedule.programs


def test_validator_marks_a_deadlock() -> None:
    # both ranks wait to receive before they send
    schedule = make(["0RB0 0F0 0SF0 0B0", "1RF0 1F0 1B0 1SB0"], microbatches=1, lowered=True)
    with pytest.raises(ScheduleError, match="deadlock") as error:
        validate(schedule)
    assert ">0RB0<" in str(error.value) and ">1RF0<" in str(error.value)


def test_validator_rejects_missing_backward() -> None:
    with pytest.raises(ScheduleError, match="has no backward"):
        validate(make(["0F0 0F1 0B0", "1F0 1F1 1B0 1B1"]))


def test_validator_rejects_order_inside_a_rank() -> None:
    # one rank holds both stages: stage 1's forward of micro-batch 0 comes before stage 0's
    with pytest.raises(ScheduleError, match="only runs later"):
        validate(make(["1F0 0F0 0F1 1F1 1B0 1B1 0B0 0B1"], layout=Layout.chunked(1, 2)))


def test_validator_rejects_wrong_stash_version() -> None:
    rows = ["0F0@0 0U@1 0F1@1 0B0@1 0U@2 0B1@1", "1F0@0 1B0@0 1U@1 1F1@1 1B1@1 1U@2"]
    with pytest.raises(ScheduleError, match="must target version \\[0\\]"):
        validate(make(rows))


# A PipeOptim-like two-stage program whose stage-0 forwards predict two updates ahead.
FIXED_LOOKAHEAD = ["0F0@0~2 0F1@0~2 0B0@0 0U@1 0B1@1 0U@2", "1F0@0 1B0@0 1U@1 1F1@1 1B1@1 1U@2"]


def test_validator_rejects_an_inexact_prediction() -> None:
    # exact rule: 0B0 must target 0F0's 0 + 2, but it runs at version 0 with no look-ahead
    with pytest.raises(ScheduleError, match=r"0B0@0 must target version \[2\]") as error:
        validate(make(FIXED_LOOKAHEAD))
    assert ">0B0@0<" in str(error.value)


def test_validator_accepts_a_fixed_lookahead_at_the_current_weights() -> None:
    # with option lookahead the forwards' prediction is approximate: the backwards need only
    # run at the current weights
    validate(make(FIXED_LOOKAHEAD, options={"lookahead": 2}, synchronous=False))


@pytest.mark.parametrize(("backward", "current"), [("0B1@0", 1), ("0B1@1~1", 1), ("0B0@1", 0)])
def test_validator_rejects_a_fixed_lookahead_backward_off_the_current_weights(
        backward: str, current: int) -> None:
    rows = list(FIXED_LOOKAHEAD)
    position = 2 if backward.startswith("0B0") else 4
    cells = rows[0].split()
    cells[position] = backward
    rows[0] = " ".join(cells)
    with pytest.raises(ScheduleError, match=f"{backward} must run at the current weights, "
                                            f"version {current} with no lookahead") as error:
        validate(make(rows, options={"lookahead": 2}, synchronous=False))
    assert f">{backward}<" in str(error.value)
    assert f"tag it {backward[:3]}@{current}" in str(error.value)


def test_validator_rejects_misplaced_action() -> None:
    with pytest.raises(ScheduleError, match="layout routes it to rank 1"):
        validate(make(["0F0 0F1 1F0 0B0 0B1", "1F1 1B0 1B1"]))


def test_grid_marks_cells() -> None:
    schedule = build_schedule("gpipe", stages=2, microbatches=2)
    grid = render_grid(schedule, marked=[(1, 0)])
    assert ">1F0@0<" in grid and grid.splitlines()[0].startswith("step")
