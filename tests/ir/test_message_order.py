"""One order of messages every rank can post in (:mod:`pipeweave.ir.message_order`): for
every registered schedule, each rank's sends come in it in program order, and each message
a rank receives comes before every send of that rank after the receive."""

from __future__ import annotations

import pytest

from pipeweave.ir import Op, dependencies, lower, ref
from pipeweave.ir.message_order import message_order
from pipeweave.schedules import available_schedules

from schedule_grid import schedules_on_grid

SHAPES = [(2, 4, 1), (3, 6, 1), (4, 8, 1), (2, 4, 2)]


def test_1f1b_on_two_ranks_literally() -> None:
    (_, _, schedule), *_ = schedules_on_grid("1f1b", [(2, 4, 1)], async_iterations=1)
    order = message_order(lower(schedule))
    assert [str(m) for m in sorted(order, key=order.__getitem__)] == [
        "0SF0", "0SF1", "1SB0", "1SB1", "0SF2", "0SF3", "1SB2", "1SB3"]


@pytest.mark.parametrize("name", [info.name for info in available_schedules()])
def test_every_rank_can_keep_to_the_order(name: str) -> None:
    for _, _, schedule in schedules_on_grid(name, SHAPES, async_iterations=2):
        lowered = schedule if schedule.lowered else lower(schedule)
        order = message_order(lowered)
        for rank, program in enumerate(lowered.programs):
            last_received, last_sent = -1, -1
            for action in program:
                if action.op in (Op.SEND_ACT, Op.SEND_GRAD):
                    place = order[ref(action)]
                    assert place > last_sent and place > last_received, (name, rank, action)
                    last_sent = place
                elif action.op in (Op.RECV_ACT, Op.RECV_GRAD):
                    (message,) = dependencies(action, lowered.layout, lowered=True)
                    last_received = max(last_received, order[message])
