"""When a rank posts its receives (:mod:`pipeweave.runtime.execution.posting`), on 1F1B's
literal programs: gloo's window (two ahead, moving at receives) and NCCL's message order."""

from __future__ import annotations

from pipeweave.ir import Action, lower
from pipeweave.ir.message_order import message_order
from pipeweave.runtime.execution.posting import OrderedPosting, WindowPosting

from schedule_grid import schedules_on_grid


def _one_f_one_b() -> tuple[list[list[Action]], dict[Action, int]]:
    (_, _, schedule), *_ = schedules_on_grid("1f1b", [(2, 4, 1)], async_iterations=1)
    lowered = lower(schedule)
    return [list(p) for p in lowered.programs], message_order(lowered)


def _routes(program: list[Action], rank: int) -> dict[int, tuple[Action, int]]:
    """``position -> (message, peer)``, the message named by its send (two ranks)."""
    routes = {}
    for p, a in enumerate(program):
        if str(a.op) in ("SF", "SB"):
            routes[p] = (a, 1 - rank)
        elif str(a.op) in ("RF", "RB"):
            sent = Action(a.op.SEND_ACT if str(a.op) == "RF" else a.op.SEND_GRAD,
                          a.stage - 1 if str(a.op) == "RF" else a.stage + 1, a.microbatch)
            routes[p] = (sent, 1 - rank)
    return routes


def _walk(policy: OrderedPosting | WindowPosting, program: list[Action]) -> list[str]:
    """The program with each early post (``+RF2``) where the policy makes it."""
    out: list[str] = []
    for position, action in enumerate(program):
        out += [f"+{program[p]}" for p in policy.before(position)]
        out.append(str(action))
        out += [f"+{program[p]}" for p in policy.after(position)]
    return out


def test_the_window_posts_the_next_two_receives_at_each_receive() -> None:
    programs, _ = _one_f_one_b()
    walked = _walk(WindowPosting(programs[1], 0), programs[1])
    # after each receive the window moves: the next two (the transport skips one posted)
    assert " ".join(walked[:9]) == "+1RF0 +1RF1 1RF0 +1RF1 +1RF2 1F0@0 1B0@0 1SB0 1RF1"


def test_the_order_posts_the_next_activation_before_the_gradient_goes_back() -> None:
    programs, order = _one_f_one_b()
    last = programs[1]
    walked = _walk(OrderedPosting(last, 0, _routes(last, 1), order), last)
    # the message order is 0SF0 0SF1 1SB0 1SB1 0SF2 0SF3 1SB2 1SB3: RF1 is posted before SB0
    assert " ".join(walked[:8]) == "1RF0 +1RF1 1F0@0 1B0@0 1SB0 1RF1 1F1@0 1B1@0"
    first = programs[0]
    walked = _walk(OrderedPosting(first, 0, _routes(first, 0), order), first)
    # rank 0 posts RB0 and RB1 (before SF2 in the order) right after SF1, ahead of use
    assert " ".join(walked[:6]) == "0F0@0 0SF0 0F1@0 0SF1 +0RB0 +0RB1"


def test_a_restart_posts_again_from_there() -> None:
    programs, order = _one_f_one_b()
    last = programs[1]
    policy = OrderedPosting(last, 0, _routes(last, 1), order)
    _walk(policy, last)
    policy.restart(4)  # from 1RF1 on again, as a run that begins there: 1SB0 is behind
    assert str(last[4]) == "1RF1" and policy.before(4) == []
    assert [str(last[p]) for p in policy.after(4)] == []  # 1SB1 comes next in the order
    assert policy.before(7) == []  # 1SB1 itself
    assert [str(last[p]) for p in policy.after(7)] == ["1RF2", "1RF3"]
