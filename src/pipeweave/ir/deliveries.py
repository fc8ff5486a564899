"""When a sent tensor is surely delivered, proved from the schedule alone (no polling).

Used by the runtime's transport to let sent tensors go, and by the planner's memory model to
count how long they stay alive (planner/memory_timeline.py): one rule for both.
"""

from __future__ import annotations

from .actions import Action, Op
from .deps import dependencies, producer_rank, receiver, ref
from .schedule import Schedule

__all__ = ["delivery_proofs"]

_LAST: list[tuple[Schedule, dict[Action, int], dict[Action, int]]] = []
"""The positions of the last schedule asked about: the memory model asks once per rank of
the same schedule, and indexing every program each time made that ranks x actions."""


def _positions(schedule: Schedule) -> tuple[dict[Action, int], dict[Action, int]]:
    """Where every message is sent and where it is received (program positions)."""
    if _LAST and _LAST[0][0] is schedule:
        return _LAST[0][1], _LAST[0][2]
    sent_at: dict[Action, int] = {}
    received_at: dict[Action, int] = {}
    for program in schedule.programs:
        for position, action in enumerate(program):
            if action.op is Op.SEND_ACT or action.op is Op.SEND_GRAD:
                sent_at[ref(action)] = position
            elif action.op is Op.RECV_ACT or action.op is Op.RECV_GRAD:
                (message,) = dependencies(action, schedule.layout, lowered=True)
                received_at[message] = position
    _LAST[:] = [(schedule, sent_at, received_at)]
    return sent_at, received_at


def delivery_proofs(schedule: Schedule, rank: int) -> dict[Action, tuple[Action, ...]]:
    """For each message ``rank`` receives, the messages it sent that have surely arrived by then.

    A sent tensor must stay alive until its transfer is done, and asking does not work:
    gloo's send ``Work.is_completed()`` stays False until someone calls ``wait()``. Waiting on
    an old send at an arbitrary point could deadlock, since schedules are proven deadlock-free
    (``ir/validate.py``) on the premise that sends never block. The schedule itself gives
    the proof instead: programs run in order and a receive blocks until its data is there, so
    when rank B sends message m (position p of B's program) every receive before p on B has
    completed; once A receives m, each of A's sends that B receives before p has arrived::

        A:  SF0 ──────────────► ... RB0   (RB0 arrives: SF0 arrived, release its buffer)
        B:        RF0  F0  B0  SB0 ──┘

    Returns ``received message -> sends (as :func:`ref` identities) delivered once it is in``;
    every send of ``rank`` appears at most once, at the earliest receive that proves it.
    """
    layout = schedule.layout
    sent_at, received_at = _positions(schedule)
    # This rank's sends per destination, in the order the destination receives them.
    outgoing: dict[int, list[tuple[int, Action]]] = {}
    for action in schedule.programs[rank]:
        if action.op is Op.SEND_ACT or action.op is Op.SEND_GRAD:
            _, dst = receiver(action, layout)
            outgoing.setdefault(dst, []).append((received_at[ref(action)], ref(action)))
    for sends in outgoing.values():
        sends.sort()
    proven = dict.fromkeys(outgoing, 0)  # per destination: sends[:proven] are known delivered
    proofs: dict[Action, tuple[Action, ...]] = {}
    for action in schedule.programs[rank]:
        if action.op is not Op.RECV_ACT and action.op is not Op.RECV_GRAD:
            continue
        (message,) = dependencies(action, layout, lowered=True)
        src = producer_rank(message, layout)
        sends = outgoing.get(src, [])
        first = last = proven.get(src, 0)
        while last < len(sends) and sends[last][0] < sent_at[message]:
            last += 1
        if last > first:
            proofs[message] = tuple(sent for _, sent in sends[first:last])
            proven[src] = last
    return proofs
