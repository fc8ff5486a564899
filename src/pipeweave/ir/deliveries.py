"""When a sent tensor is surely delivered, proved from the schedule alone (no polling).

Used by the runtime's transport to let sent tensors go, and by the planner's memory model to
count how long they stay alive (planner/memory_timeline.py): one rule for both.
"""

from __future__ import annotations

from .actions import Action, Op
from .deps import destination, message_of, producer_rank, ref
from .schedule import Schedule

__all__ = ["delivery_proofs", "every_delivery_proof", "message_positions", "Positions"]

Positions = tuple[dict[Action, int], dict[Action, int]]
"""Where every message is sent and where it is received (program positions), by :func:`ref`."""


def delivery_proofs(schedule: Schedule, rank: int,
                    positions: Positions | None = None) -> dict[Action, tuple[Action, ...]]:
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
    ``positions``: :func:`message_positions` of ``schedule``, when already at hand.
    """
    layout = schedule.layout
    sent_at, received_at = positions if positions is not None else message_positions(schedule)
    # This rank's sends per destination, in the order the destination receives them.
    outgoing: dict[int, list[tuple[int, Action]]] = {}
    for action in schedule.programs[rank]:
        op = action[0]
        if op is _SF or op is _SB:
            sent = ref(action)
            outgoing.setdefault(destination(action, layout), []).append(
                (received_at[sent], sent))
    for sends in outgoing.values():
        sends.sort()
    proven = dict.fromkeys(outgoing, 0)  # per destination: sends[:proven] are known delivered
    proofs: dict[Action, tuple[Action, ...]] = {}
    for action in schedule.programs[rank]:
        op = action[0]
        if op is not _RF and op is not _RB:
            continue
        message = message_of(action)
        src = producer_rank(message, layout)
        sends = outgoing.get(src, [])
        first = last = proven.get(src, 0)
        while last < len(sends) and sends[last][0] < sent_at[message]:
            last += 1
        if last > first:
            proofs[message] = tuple([sent for _, sent in sends[first:last]])
            proven[src] = last
    return proofs


def every_delivery_proof(schedule: Schedule) -> list[dict[Action, tuple[Action, ...]]]:
    """:func:`delivery_proofs` of every rank, the message positions found once."""
    positions = message_positions(schedule)
    return [delivery_proofs(schedule, rank, positions) for rank in range(schedule.num_ranks)]


def message_positions(schedule: Schedule) -> Positions:
    """Where each message is sent and received, in its sender's and receiver's programs."""
    sent_at: dict[Action, int] = {}
    received_at: dict[Action, int] = {}
    for program in schedule.programs:
        for position, action in enumerate(program):
            op = action[0]
            if op is _SF or op is _SB:
                sent_at[ref(action)] = position
            elif op is _RF or op is _RB:
                received_at[message_of(action)] = position
    return sent_at, received_at


_SF, _SB, _RF, _RB = Op.SEND_ACT, Op.SEND_GRAD, Op.RECV_ACT, Op.RECV_GRAD
