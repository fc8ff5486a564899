"""One order of a schedule's point-to-point messages that every rank agrees on.

Under rendezvous (NCCL, large messages: :mod:`.rendezvous`) a send finishes only while its
receive runs, and each rank's operations run one group after another in posting order. If
every rank posts its sends and receives in the order of one global sequence of messages,
nothing can wait in a ring: the first message of the sequence not yet delivered is next on
both its ranks, so it goes. A rank can keep to the sequence if

1. its sends come in it in program order (a send is posted when its tensor is computed), and
2. a message it *receives* comes before every message it sends after using it (the receive
   must be posted before the tensor is used, so before every later post).

The order in which a run with buffered sends sends the messages has both properties (a
receive that a rank uses before a send was sent before it). :func:`message_order` runs the
lowered programs that way (round-robin, a send delivered at once, a receive waiting for
its send; nothing else waits), the same on every rank since it reads only the schedule.
"""

from __future__ import annotations

from .actions import Action, Op
from .deps import dependencies, ref
from .schedule import Schedule
from .walk import ScheduleError

__all__ = ["message_order"]

_SENDS = (Op.SEND_ACT, Op.SEND_GRAD)
_RECEIVES = (Op.RECV_ACT, Op.RECV_GRAD)


def message_order(schedule: Schedule) -> dict[Action, int]:
    """Each message (the :func:`~.deps.ref` of its send) ``->`` its place in the order."""
    if not schedule.lowered:
        raise ValueError("message_order needs a lowered schedule (pipeweave.ir.lower)")
    programs = schedule.programs
    layout = schedule.layout
    positions = [0] * len(programs)
    order: dict[Action, int] = {}
    moved = True
    while moved:
        moved = False
        for rank, program in enumerate(programs):
            position = positions[rank]
            while position < len(program):
                action = program[position]
                if action.op in _RECEIVES:
                    (message,) = dependencies(action, layout, lowered=True)
                    if message not in order:
                        break
                elif action.op in _SENDS:
                    order.setdefault(ref(action), len(order))
                position += 1
            moved = moved or position != positions[rank]
            positions[rank] = position
    stuck = [(rank, p) for rank, p in enumerate(positions) if p < len(programs[rank])]
    if stuck:
        raise ScheduleError(f"receives whose messages are never sent, at (rank, position) {stuck}; "
                            f"the schedule cannot run (pipeweave.ir.validate says why)")
    return order
