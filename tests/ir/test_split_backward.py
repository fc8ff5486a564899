"""The split backward in the IR: I (input gradient) and W (weight gradient) beside B."""

from __future__ import annotations

import pytest

from pipeweave.ir import (Action, Layout, Op, Schedule, ScheduleError, dependencies, lower,
                          parse_action, ref, validate)
from pipeweave.ir.lower import merge_backward
from pipeweave.ir.updates import update_sizes

# 1F1B, P = 2, M = 2, with every backward split and W of stage 1 deferred by one slot.
SPLIT_1F1B = [
    "0F0 0F1 0I0 0W0 0I1 0W1 0U@1",
    "1F0 1I0 1F1 1I1 1W0 1W1 1U@1",
]


def make(rows: list[str], **fields: object) -> Schedule:
    programs = tuple(tuple(parse_action(t) for t in row.split()) for row in rows)
    defaults: dict[str, object] = dict(name="hand", layout=Layout.straight(len(rows)),
                                       microbatches=2, iterations=1)
    return Schedule(programs=programs, **{**defaults, **fields})  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["1I3", "0W5@2", "2I0#1", "3W7a"])
def test_text_form_parses_back(text: str) -> None:
    assert str(parse_action(text)) == text


def test_an_input_gradient_is_the_backward_the_previous_stage_waits_for() -> None:
    layout = Layout.straight(3)
    assert ref(parse_action("1I4@2")) == Action(Op.BACKWARD, 1, 4)
    assert dependencies(parse_action("1I4"), layout) == (Action(Op.BACKWARD, 2, 4),)
    assert dependencies(parse_action("1B4"), layout) == (Action(Op.BACKWARD, 2, 4),)
    assert dependencies(parse_action("2I4"), layout) == ()  # the last stage starts from the loss
    assert dependencies(parse_action("1W4"), layout) == ()  # its I: same-rank program order
    assert dependencies(parse_action("1SB4"), layout) == (Action(Op.BACKWARD, 1, 4),)


def test_validator_accepts_a_split_schedule_lowered_or_not() -> None:
    schedule = make(SPLIT_1F1B)
    validate(schedule)
    validate(lower(schedule))
    assert update_sizes(schedule) == {(0, 0): 2, (1, 0): 2}  # W counts for its update


def test_lowering_sends_the_gradient_after_I_and_merges_where_nothing_is_sent() -> None:
    lowered = lower(make(SPLIT_1F1B))
    assert " ".join(map(str, lowered.programs[1])) == (
        "1RF0 1F0 1I0 1SB0 1RF1 1F1 1I1 1SB1 1W0 1W1 1U@1")
    # stage 0 sends no gradient: each I next to its W becomes one B
    assert " ".join(map(str, lowered.programs[0])) == (
        "0F0 0SF0 0F1 0SF1 0RB0 0B0 0RB1 0B1 0U@1")


def test_merge_keeps_the_version_and_leaves_separated_halves_alone() -> None:
    program = [parse_action(t) for t in "0I0@3 0W0@3 0I1@3 0F2@3 0W1@3".split()]
    assert [str(a) for a in merge_backward(program)] == ["0B0@3", "0I1@3", "0F2@3", "0W1@3"]


@pytest.mark.parametrize("stage1, message", [
    ("1F0 1I0 1F1 1I1 1W1 1U@1", "has an input-gradient backward I but no weight-gradient W"),
    ("1F0 1B0 1F1 1I1 1W0 1W1 1U@1", "has a whole backward B and a W"),
])
def test_validator_rejects_an_incomplete_or_doubled_backward(stage1: str, message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        validate(make([SPLIT_1F1B[0], stage1]))


def test_validator_rejects_a_W_before_its_I() -> None:
    rows = ["0F0 0F1 0W0 0I0 0I1 0W1 0U@1", SPLIT_1F1B[1]]
    with pytest.raises(ScheduleError, match="0W0 at step 2 needs 0B0, which rank 0 only runs later"):
        validate(make(rows))


def test_validator_rejects_a_W_on_another_version_than_its_I() -> None:
    rows = ["0F0@0 0F1@0 0I0@0 0W0@1 0I1@0 0W1@0 0U@1", "1F0 1I0 1F1 1I1 1W0 1W1 1U@1"]
    with pytest.raises(ScheduleError, match=r"0W0@1 must carry its I's version \(0\)"):
        validate(make(rows))


def test_validator_rejects_a_weight_gradient_after_the_update_it_belongs_to() -> None:
    rows = ["0F0 0F1 0I0 0W0 0I1 0U@1 0W1", SPLIT_1F1B[1]]
    with pytest.raises(ScheduleError, match="0W1 is a weight gradient of iteration 0 but runs "
                                            "after 1 updates of stage 0") as error:
        validate(make(rows))
    assert ">0W1<" in str(error.value)


def test_validator_rejects_a_weight_gradient_after_the_all_reduce_that_sums_it() -> None:
    layout = Layout.replicated([2, 1])  # stage 0 on ranks 0 and 1 (micro-batches 0 and 1)
    rows = ["0F0 0I0 0AR@1 0W0 0U@1", "0F1 0I1 0W1 0AR@1 0U@1", "1F0 1F1 1I0 1W0 1I1 1W1 1U@1"]
    with pytest.raises(ScheduleError, match="0W0 is a weight gradient of iteration 0 but runs "
                                            "after the all-reduce of stage 0 on rank 0"):
        validate(make(rows, layout=layout))
    rows[0] = "0F0 0I0 0W0 0AR@1 0U@1"
    validate(make(rows, layout=layout))
