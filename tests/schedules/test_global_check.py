"""zb-h2's global gradient check as IR actions: before the update (a flush) or after it (the
zero-bubble paper's optimizer post-validation, §4): literal programs, what the validator
refuses, and what the simulator times."""

from __future__ import annotations

import itertools

import pytest

from pipeweave.ir import Action, Op, ScheduleError, lower, parse_action, validate
from pipeweave.schedules import build_schedule
from pipeweave.sim import Costs, simulate


def zb_h2(p: int, m: int, k: int, post: bool | None):  # type: ignore[no-untyped-def]
    options = {} if post is None else {"post_validation": post}
    return build_schedule("zb-h2", stages=p, microbatches=m, iterations=k, **options)


def text(program: tuple[Action, ...]) -> str:
    return " ".join(str(a.with_(version=None)) if a.microbatch is not None else str(a)
                    for a in program)


def test_check_actions_print_and_parse_back() -> None:
    for cell in ("1C@2", "0V@3", "2C@1#1"):
        assert str(parse_action(cell)) == cell
    assert parse_action("1C@2").op is Op.CHECK and parse_action("0V@3").op is Op.VALIDATE


def test_literal_post_validation_two_ranks() -> None:
    # each stage checks (C) and steps (U) at the end of its iteration, runs the next
    # iteration's leading forwards, then validates (V) before its first backward
    s = zb_h2(2, 4, 2, post=True)
    assert [text(p) for p in s.programs] == [
        "0F0 0F1 0F2 0I0 0W0 0F3 0I1 0W1 0I2 0W2 0I3 0W3 0C@1 0U@1 "
        "0F4 0F5 0F6 0V@1 0I4 0W4 0F7 0I5 0W5 0I6 0W6 0I7 0W7 0C@2 0U@2 0V@2",
        "1F0 1I0 1F1 1I1 1F2 1I2 1W0 1F3 1I3 1W1 1W2 1W3 1C@1 1U@1 "
        "1F4 1V@1 1I4 1F5 1I5 1F6 1I6 1W4 1F7 1I7 1W5 1W6 1W7 1C@2 1U@2 1V@2",
    ]
    flushed = zb_h2(2, 4, 2, post=False)
    assert "0C@1 0V@1 0U@1 0F4" in text(flushed.programs[0])
    validate(s), validate(lower(s)), validate(flushed), validate(lower(flushed))


@pytest.mark.parametrize(("p", "m", "k"), [(2, 4, 3), (3, 5, 3), (4, 8, 3), (4, 8, 2), (5, 9, 2)])
def test_post_validation_keeps_the_tiling_the_check_before_the_update_breaks(
        p: int, m: int, k: int) -> None:
    """Unit costs: with the check after the update, K iterations take 3KM + P - 1 as without
    a check (the parallelograms tile); with the check before it every update waits for the
    round trip of the check, and each later iteration pays for it."""
    for latency in (0.0, 0.1):
        costs = Costs(latency=latency)
        unchecked, before, after = (simulate(lower(zb_h2(p, m, k, post)), costs).makespan
                                    for post in (None, False, True))
        assert after < before, (p, m, k, latency)
        if latency == 0:
            assert after == unchecked == 3 * k * m + p - 1
            assert before > 3 * k * m + p - 1


def test_one_iteration_costs_the_same_either_way() -> None:
    for p, m in itertools.product((2, 3, 4), (4, 8)):
        assert (simulate(zb_h2(p, m, 1, True)).makespan
                == simulate(zb_h2(p, m, 1, False)).makespan
                == simulate(zb_h2(p, m, 1, None)).makespan)


def _replace(program: tuple[Action, ...], moves: dict[str, str]) -> tuple[Action, ...]:
    return tuple(parse_action(moves.get(str(a), str(a))) for a in program)


def _moved(schedule, rank: int, cell: str, before: str):  # type: ignore[no-untyped-def]
    """``cell`` taken out of rank ``rank``'s program and put back right before ``before``."""
    program = [a for a in schedule.programs[rank] if str(a) != cell]
    at = next(i for i, a in enumerate(program) if str(a) == before)
    program.insert(at, parse_action(cell))
    programs = list(schedule.programs)
    programs[rank] = tuple(program)
    return schedule.with_programs(programs)


def test_the_validator_refuses_a_misplaced_check() -> None:
    s = zb_h2(2, 4, 2, post=True)
    # a backward between the update and its validation could not be redone
    with pytest.raises(ScheduleError, match=r"runs between 0U@1 and its validation 0V@1"):
        validate(_moved(s, 0, "0V@1", "0W4@1"))
    # the check must see every gradient its update consumes
    with pytest.raises(ScheduleError, match=r"0W3@0 runs after 0C@1"):
        validate(_moved(s, 0, "0C@1", "0W3@0"))
    # validation before the check it completes
    with pytest.raises(ScheduleError, match=r"1V@2 at step 27 needs 1C@2, which rank 1 only runs later"):
        validate(_moved(s, 1, "1V@2", "1C@2"))
    # every update checked
    programs = list(s.programs)
    programs[1] = tuple(a for a in programs[1] if str(a) != "1V@1")
    with pytest.raises(ScheduleError, match=r"1U@1 has no V@1 of stage 1"):
        validate(s.with_programs(programs))


def test_option_values_and_shapes_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match=r"post_validation='yes' must be true .* or false"):
        zb_h2(2, 4, 1, "yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"one rank per stage.*use width 1"):
        build_schedule("zb-h2", stages=2, microbatches=4, width=2, post_validation=True)
    with pytest.raises(ValueError, match=r"accepts: none"):
        build_schedule("zb-h1", stages=2, microbatches=4, post_validation=True)


def test_grid_valid_lowered_and_deadlock_free() -> None:
    for p, m, k, post in itertools.product((1, 2, 3, 4, 5), (1, 2, 3, 5, 8), (1, 2, 3),
                                           (False, True)):
        s = zb_h2(p, m, k, post)
        validate(s)
        lowered = lower(s)
        validate(lowered)
        assert simulate(lowered).makespan == simulate(s).makespan, (p, m, k, post)
        checks = [a for _, _, a in s.actions() if a.op in (Op.CHECK, Op.VALIDATE)]
        assert len(checks) == 2 * p * k
